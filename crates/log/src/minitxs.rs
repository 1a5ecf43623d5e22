//! The log's minitransactions, built and read back here so that every driver (the async
//! client, the sequencer's driver, the simulator) runs the same ones: create, append and
//! fill (write once, fenced by epoch and trim), read, seal, reserve, trim, and the reads of
//! the slow check. Why each compare is there is in docs/log.md, "Protocol".

use crate::entry::Entry;
use crate::layout::{word, LogLayout, MAGIC};
use crate::sequencer::Reservation;
use tutti_client::{Minitx, Outcome};
use tutti_wire::{CmpOp, NodeId};

/// The class these minitransactions are counted under in the nodes' load statistics.
pub const CLASS: &str = "log";

/// Bytes of a slot read in one go: enough for most entries, so that a read takes one round
/// trip; a longer entry takes a second.
pub const READ_PREFIX_BYTES: u32 = 4096;

fn u64_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes read"))
}

/// Writes every node's region header, refusing (failed compare) if any region is in use.
pub fn create(layout: &LogLayout) -> Minitx {
    let mut words = Vec::with_capacity(word::END as usize);
    words.extend_from_slice(&MAGIC.to_le_bytes());
    words.extend_from_slice(&1u64.to_le_bytes());
    words.extend_from_slice(&[0; 24]);
    words.extend_from_slice(&layout.layout_word());
    on_every_node(layout, |tx, node, base| {
        tx.compare_u64(node, base + word::MAGIC, CmpOp::Eq, 0)
            .write(node, base, words.clone())
    })
}

/// Why a write of a position (append or fill) was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The log is at a later epoch than the writer's.
    Sealed { epoch: u64 },
    /// The position is written already, by `writer`.
    Taken { writer: u64 },
    /// The position is trimmed.
    Trimmed { trim: u64 },
    /// The slot still holds an untrimmed position one period earlier: the log is full.
    Full { trim: u64 },
}

/// One position's write: its entry, encoded for its slot, and the epoch it was granted in.
#[derive(Clone, Debug)]
pub struct SlotWrite {
    pub position: u64,
    pub epoch: u64,
    pub bytes: Vec<u8>,
}

impl SlotWrite {
    pub fn new(layout: &LogLayout, epoch: u64, entry: &Entry) -> SlotWrite {
        SlotWrite {
            position: entry.position,
            epoch,
            bytes: entry.encode(layout.backpointers),
        }
    }
}

/// What became of one write of a batch (`written`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// The entry is at its position.
    Done,
    /// The node refused it.
    Refused(Refusal),
    /// Not written, though its own compares held: another write of its batch was refused
    /// (a batch is one minitransaction, all or nothing). Write it again.
    Again,
    /// The batch's outcome is unknown: the entry may be there or not. Write it again at the
    /// same position (never take a new one: it could land twice), after a pause.
    Unknown,
}

/// Writes `writes` (positions on one node, all granted in one epoch) in one minitransaction
/// if the log is in that epoch and each slot is free for its position: its tag is below
/// the position plus one, and the position one period earlier is trimmed. All or nothing;
/// read back by `written`, one result per write, in order.
pub fn write_batch(layout: &LogLayout, writes: Vec<SlotWrite>) -> Minitx {
    let first = writes.first().expect("a batch writes something");
    let (slot, epoch) = (layout.slot(first.position), first.epoch);
    let (node, header) = (slot.node, slot.header);
    let period = layout.period();
    let mut tx =
        Minitx::new()
            .class(CLASS)
            .compare_u64(node, header + word::EPOCH, CmpOp::Eq, epoch);
    // The trim point must cover the position a period before the latest one.
    if let Some(p) = writes
        .iter()
        .map(|w| w.position)
        .filter(|&p| p >= period)
        .max()
    {
        tx = tx.compare_u64(node, header + word::TRIM, CmpOp::Ge, p + 1 - period);
    }
    let addrs: Vec<u64> = (writes.iter())
        .map(|w| {
            let slot = layout.slot(w.position);
            assert!(
                slot.node == node && w.epoch == epoch,
                "a batch is one node's, in one epoch"
            );
            slot.addr
        })
        .collect();
    for (w, &addr) in writes.iter().zip(&addrs) {
        tx = tx.compare_u64(node, addr, CmpOp::Lt, w.position + 1);
    }
    tx = tx.read(node, header + word::EPOCH, 16);
    for &addr in &addrs {
        tx = tx.read(node, addr, 24);
    }
    for (w, addr) in writes.into_iter().zip(addrs) {
        tx = tx.write(node, addr, w.bytes);
    }
    tx
}

/// What became of each of `positions`, written in `epoch` by `write_batch` with `outcome`.
pub fn written(
    layout: &LogLayout,
    epoch: u64,
    positions: &[u64],
    outcome: &Outcome,
) -> Vec<Written> {
    if outcome.committed {
        return vec![Written::Done; positions.len()];
    }
    let words = &outcome.reads[0];
    (positions.iter().zip(&outcome.reads[1..]))
        .map(|(&p, slot)| match refusal(layout, p, epoch, words, slot) {
            Some(why) => Written::Refused(why),
            None if crate::planted(crate::Bug::HeldBackCountsAsWritten) => Written::Done,
            None => Written::Again,
        })
        .collect()
}

/// Writes `entry` at its position if the slot is free for it and the log is in `epoch` (a
/// batch of one). Read back by `write_refusal`.
pub fn write(layout: &LogLayout, epoch: u64, entry: &Entry) -> Minitx {
    write_batch(layout, vec![SlotWrite::new(layout, epoch, entry)])
}

/// Why `write`'s minitransaction did not commit, from the words it read.
pub fn write_refusal(layout: &LogLayout, position: u64, epoch: u64, outcome: &Outcome) -> Refusal {
    let words = &outcome.reads[0];
    refusal(layout, position, epoch, words, &outcome.reads[1]).unwrap_or(Refusal::Full {
        trim: u64_of(&words[8..16]),
    })
}

/// Why the write of `position` in `epoch` was refused, from its node's epoch and trim words
/// and its slot's first bytes as the write's minitransaction read them; `None` if every
/// compare of this write held. A slot that holds the position comes first: a writer
/// retrying after an unknown outcome must learn that its entry is there even if the log was
/// sealed since.
fn refusal(
    layout: &LogLayout,
    position: u64,
    epoch: u64,
    words: &[u8],
    slot: &[u8],
) -> Option<Refusal> {
    let (log_epoch, trim, tag) = (
        u64_of(&words[0..8]),
        u64_of(&words[8..16]),
        u64_of(&slot[0..8]),
    );
    let period = layout.period();
    if tag == position + 1 {
        Some(Refusal::Taken {
            writer: u64_of(&slot[16..24]),
        })
    } else if log_epoch != epoch {
        Some(Refusal::Sealed { epoch: log_epoch })
    } else if position < trim {
        Some(Refusal::Trimmed { trim })
    } else if tag > position + 1 || (position >= period && trim < position + 1 - period) {
        Some(Refusal::Full { trim })
    } else {
        None
    }
}

/// Reads `position`'s slot (its first `len` bytes) with its node's epoch and trim words.
pub fn read(layout: &LogLayout, position: u64, len: u32) -> Minitx {
    let slot = layout.slot(position);
    Minitx::new()
        .class(CLASS)
        .read(slot.node, slot.header + word::EPOCH, 16)
        .read(slot.node, slot.addr, len.min(layout.slot_bytes))
}

/// What `read` found: the node's epoch and trim point, and the slot's bytes.
pub fn read_result(outcome: &Outcome) -> (u64, u64, &[u8]) {
    let words = &outcome.reads[0];
    (
        u64_of(&words[0..8]),
        u64_of(&words[8..16]),
        &outcome.reads[1],
    )
}

/// The log's control words as every node holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Words {
    pub magic: u64,
    pub epoch: u64,
    pub trim: u64,
    pub reserved_from: u64,
    pub reserved_to: u64,
}

impl Words {
    /// The words from a node's region header (its first `word::LAYOUT` bytes).
    pub fn parse(bytes: &[u8]) -> Words {
        Words {
            magic: u64_of(&bytes[0..]),
            epoch: u64_of(&bytes[8..]),
            trim: u64_of(&bytes[16..]),
            reserved_from: u64_of(&bytes[24..]),
            reserved_to: u64_of(&bytes[32..]),
        }
    }
}

/// One minitransaction with `items` added for every node of the log (given its id and its
/// region's address): the changes to the control words, which all nodes make at once.
fn on_every_node(layout: &LogLayout, items: impl Fn(Minitx, NodeId, u64) -> Minitx) -> Minitx {
    (layout.nodes.iter()).fold(Minitx::new().class(CLASS), |tx, &(node, base)| {
        items(tx, node, base)
    })
}

/// Reads every node's control words at once.
pub fn words(layout: &LogLayout) -> Minitx {
    on_every_node(layout, |tx, node, base| {
        tx.read(node, base, word::LAYOUT as u32)
    })
}

/// Reads of the epoch word, one minitransaction per node of the log. A seal raises every
/// node's epoch in one minitransaction, so any one node's is the log's: a fast check's
/// answer is current if its epoch is still the log's after it was given (docs/log.md,
/// "Client"). Any one of them will do: a client runs them all and takes the first outcome,
/// so that a node down does not hold the check up.
pub fn epoch(layout: &LogLayout) -> Vec<Minitx> {
    (layout.nodes.iter())
        .map(|&(node, base)| Minitx::new().class(CLASS).read(node, base + word::EPOCH, 8))
        .collect()
}

/// The epoch `epoch` read.
pub fn epoch_result(outcome: &Outcome) -> u64 {
    u64_of(&outcome.reads[0])
}

/// The words `words` read, per node in layout order.
pub fn words_result(outcome: &Outcome) -> Vec<Words> {
    outcome.reads.iter().map(|b| Words::parse(b)).collect()
}

/// Raises the epoch of every node to `epoch`, or of none if any is there already; reads
/// every node's words as they were. After it commits, no write in an older epoch can.
pub fn seal(layout: &LogLayout, epoch: u64) -> Minitx {
    on_every_node(layout, |tx, node, base| {
        tx.compare_u64(node, base + word::EPOCH, CmpOp::Lt, epoch)
            .read(node, base, word::LAYOUT as u32)
            .write(node, base + word::EPOCH, epoch.to_le_bytes().to_vec())
    })
}

/// Makes a sequencer's reservation durable on every node, if the log is still in its epoch;
/// reads every node's trim point (`reserve_result`), which clients move.
pub fn reserve(layout: &LogLayout, r: &Reservation) -> Minitx {
    let mut words = r.from.to_le_bytes().to_vec();
    words.extend_from_slice(&r.to.to_le_bytes());
    on_every_node(layout, |tx, node, base| {
        tx.compare_u64(node, base + word::EPOCH, CmpOp::Eq, r.epoch)
            .read(node, base + word::TRIM, 8)
            .write(node, base + word::RESERVED_FROM, words.clone())
    })
}

/// The log's trim point as `reserve` read it (the highest of the nodes'; they agree unless a
/// trim is half applied).
pub fn reserve_result(outcome: &Outcome) -> u64 {
    outcome.reads.iter().map(|b| u64_of(b)).max().unwrap_or(0)
}

/// Moves every node's trim point up to `prefix`; a failed compare means some node's is
/// there already (trims only grow).
pub fn trim(layout: &LogLayout, prefix: u64) -> Minitx {
    on_every_node(layout, |tx, node, base| {
        tx.compare_u64(node, base + word::TRIM, CmpOp::Lt, prefix)
            .write(node, base + word::TRIM, prefix.to_le_bytes().to_vec())
    })
}

/// Reads the headers of the slots of `positions` (at most `Limits::items_max`), with room
/// for `streams` stream headers each: the backward scans of the slow check and of a new
/// sequencer.
pub fn headers(layout: &LogLayout, positions: &[u64], streams: usize) -> Minitx {
    let len =
        (crate::entry::header_bytes(streams, layout.backpointers) as u32).min(layout.slot_bytes);
    positions.iter().fold(Minitx::new().class(CLASS), |tx, &p| {
        let slot = layout.slot(p);
        tx.read(slot.node, slot.addr, len)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two nodes of 5 slots: a period of 10 positions.
    fn layout() -> LogLayout {
        crate::layout::two_nodes(4096, 5)
    }

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A write's outcome that did not commit, having read `words` (epoch, trim) and each
    /// slot's tag, epoch and writer.
    pub(crate) fn refused(words: [u64; 2], slots: &[[u64; 3]]) -> Outcome {
        let mut reads = vec![bytes(&words)];
        reads.extend(slots.iter().map(|s| bytes(s)));
        Outcome {
            committed: false,
            reads,
            failed_compares: vec![0],
        }
    }

    #[test]
    fn a_slot_holding_the_position_is_reported_before_a_seal() {
        let l = layout();
        let after_seal = refused([3, 0], &[[6, 2, 77]]);
        assert_eq!(
            write_refusal(&l, 5, 2, &after_seal),
            Refusal::Taken { writer: 77 },
            "a retry finds its own entry although the log moved on"
        );
        assert_eq!(
            write_refusal(&l, 5, 2, &refused([3, 0], &[[0, 0, 0]])),
            Refusal::Sealed { epoch: 3 }
        );
        assert_eq!(
            write_refusal(&l, 5, 2, &refused([2, 9], &[[0, 0, 0]])),
            Refusal::Trimmed { trim: 9 }
        );
        assert_eq!(
            write_refusal(&l, 15, 2, &refused([2, 3], &[[6, 2, 1]])),
            Refusal::Full { trim: 3 }
        );
    }

    #[test]
    fn a_batch_tells_the_refused_writes_from_those_to_write_again() {
        let l = layout();
        let entry = |position| Entry {
            position,
            epoch: 2,
            writer: 9,
            content: crate::entry::Content::Junk,
        };
        let writes = [4, 6, 8].map(|p| SlotWrite::new(&l, 2, &entry(p)));
        let tx = write_batch(&l, writes.to_vec());
        assert_eq!(
            tx.items().len(),
            1 + 3 + 1 + 3 + 3,
            "one epoch compare, no trim yet"
        );
        let outcome = refused([2, 0], &[[0, 0, 0], [7, 2, 55], [0, 0, 0]]);
        assert_eq!(
            written(&l, 2, &[4, 6, 8], &outcome),
            vec![
                Written::Again,
                Written::Refused(Refusal::Taken { writer: 55 }),
                Written::Again
            ]
        );
        // A lap later: 14 needs 4 trimmed, 16 needs 6; the trim point is 5.
        let outcome = refused([2, 5], &[[5, 1, 1], [7, 1, 1]]);
        assert_eq!(
            written(&l, 2, &[14, 16], &outcome),
            vec![Written::Again, Written::Refused(Refusal::Full { trim: 5 })]
        );
        let sealed = refused([3, 5], &[[5, 1, 1], [7, 1, 1]]);
        assert!(written(&l, 2, &[14, 16], &sealed)
            .iter()
            .all(|w| *w == Written::Refused(Refusal::Sealed { epoch: 3 })));
    }
}
