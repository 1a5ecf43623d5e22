//! How a new sequencer takes a log over (Tango §5, "Failure handling") and how anyone finds
//! the tail from the memory nodes alone (CORFU's slow check), as sans-I/O steps: each input
//! is the outcome of the minitransaction the previous step asked for. Nothing here trusts
//! any sequencer's memory: the seal fences the old epoch on every node, the reservation
//! words bound where the old sequencer may have handed out positions, and the slots say
//! which of those were written and in which streams.

use crate::entry::{held_position, holds, peek_streams, StreamId, STREAMS_PER_ENTRY_MAX};
use crate::layout::LogLayout;
use crate::minitxs::{self, Words};
use crate::{planted, Bug};
use tutti_client::{Minitx, Outcome};

/// Slot headers read per minitransaction of a scan.
pub const SCAN_CHUNK: u64 = 1024;

/// What to do next: run this minitransaction and hand its outcome back, or done.
#[derive(Debug)]
pub enum Step<T> {
    Run(Minitx),
    Done(T),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TakeoverError {
    #[error("the log is at epoch {0} already: a later sequencer sealed it")]
    Superseded(u64),
    #[error("the log's region holds no log (magic {0:#x})")]
    NotALog(u64),
    #[error("slot of position {0} is corrupt")]
    Corrupt(u64),
}

/// The words every node agrees on (they change only on all nodes at once); the maximum
/// of each, to be safe against reading them mid-change in a failed seal.
fn agreed(words: &[Words]) -> Result<Words, TakeoverError> {
    let magic = words[0].magic;
    if magic != crate::layout::MAGIC {
        return Err(TakeoverError::NotALog(magic));
    }
    let max = |f: fn(&Words) -> u64| words.iter().map(f).max().expect("a log has nodes");
    Ok(Words {
        magic,
        epoch: max(|w| w.epoch),
        trim: max(|w| w.trim),
        reserved_from: max(|w| w.reserved_from),
        reserved_to: max(|w| w.reserved_to),
    })
}

/// The slow check: the highest written position below `reserved_to`, plus one; at least
/// `reserved_from`. Scans down from `reserved_to` a chunk at a time and stops at the first
/// written slot, so it reads about one lease of headers at most.
#[derive(Debug)]
pub struct SlowCheck {
    layout: LogLayout,
    floor: u64,
    /// The chunk in flight covers positions below this.
    high: u64,
    /// The words are read and the scan has begun.
    scanning: bool,
}

impl SlowCheck {
    /// Starts by reading every node's words.
    pub fn start(layout: &LogLayout) -> (SlowCheck, Minitx) {
        let check = SlowCheck {
            layout: layout.clone(),
            floor: 0,
            high: 0,
            scanning: false,
        };
        (check, minitxs::words(layout))
    }

    /// Starts from words read already (by a seal).
    fn from_words(layout: &LogLayout, words: Words) -> (SlowCheck, Step<u64>) {
        let mut check = SlowCheck {
            layout: layout.clone(),
            floor: words.reserved_from,
            high: words.reserved_to,
            scanning: true,
        };
        let step = check.next_chunk();
        (check, step)
    }

    fn chunk(&self) -> Vec<u64> {
        scan_chunk(self.floor, self.high)
    }

    fn next_chunk(&mut self) -> Step<u64> {
        if self.high <= self.floor {
            return Step::Done(self.floor);
        }
        Step::Run(minitxs::headers(&self.layout, &self.chunk(), 0))
    }

    pub fn on_outcome(&mut self, outcome: &Outcome) -> Result<Step<u64>, TakeoverError> {
        if !self.scanning {
            let words = agreed(&minitxs::words_result(outcome))?;
            let (check, step) = SlowCheck::from_words(&self.layout, words);
            *self = check;
            return Ok(step);
        }
        // Only the position tags are read: an entry's streams do not matter here.
        for (p, bytes) in self.chunk().into_iter().zip(&outcome.reads) {
            if holds(p, bytes) {
                return Ok(Step::Done(p + 1));
            }
        }
        self.high = chunk_low(self.floor, self.high);
        Ok(self.next_chunk())
    }
}

/// What a takeover found: the new sequencer starts from it (`Sequencer::start`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    pub epoch: u64,
    /// The first position of the new epoch: the old reservation's end, so that no position
    /// an earlier sequencer may have handed out (or told a reader was below its tail) is
    /// handed out again.
    pub tail: u64,
    /// The trim point the seal read.
    pub trim: u64,
    /// Streams of every data entry below the tail down to the trim point, newest first.
    pub history: Vec<(u64, Vec<StreamId>)>,
}

#[derive(Debug)]
enum Phase {
    Seal,
    Scan { floor: u64, high: u64 },
}

/// A takeover at `epoch` (taken from the manager with `TakeRegion`): seal every node at it,
/// then scan back from the old reservation's end to the trim point for the streams.
#[derive(Debug)]
pub struct Takeover {
    layout: LogLayout,
    epoch: u64,
    phase: Phase,
    /// Where the new epoch starts: the reservation's end the seal read.
    tail: u64,
    trim: u64,
    history: Vec<(u64, Vec<StreamId>)>,
    /// Entries found in the slots of never-written positions: older than every scanned
    /// position, so they follow `history`, newest first.
    older: Vec<(u64, Vec<StreamId>)>,
}

impl Takeover {
    pub fn start(layout: &LogLayout, epoch: u64) -> (Takeover, Minitx) {
        let t = Takeover {
            layout: layout.clone(),
            epoch,
            phase: Phase::Seal,
            tail: 0,
            trim: 0,
            history: Vec::new(),
            older: Vec::new(),
        };
        let seal = if planted(Bug::ResumeWithoutSeal) {
            minitxs::words(layout)
        } else if planted(Bug::PartialSeal) {
            let first = LogLayout {
                nodes: layout.nodes[..1].to_vec(),
                ..layout.clone()
            };
            minitxs::seal(&first, epoch)
        } else {
            minitxs::seal(layout, epoch)
        };
        (t, seal)
    }

    /// The epoch this takeover seals at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn on_outcome(&mut self, outcome: &Outcome) -> Result<Step<TakenOver>, TakeoverError> {
        match &mut self.phase {
            Phase::Seal => {
                let words = agreed(&minitxs::words_result(outcome))?;
                if !outcome.committed {
                    return Err(TakeoverError::Superseded(words.epoch));
                }
                // No position at or above reserved_to was ever handed out, so every written
                // entry is below it. The positions between the last written one and it were
                // perhaps handed out and never written: they stay holes, filled by whoever
                // reads them. Handing them out again would put new entries below a tail a
                // reader was already told, where its next sync (which reads only what
                // backpointers name) never looks.
                self.tail = words.reserved_to;
                self.trim = words.trim;
                if planted(Bug::ResumeWithoutSeal) {
                    (self.epoch, self.tail) = (words.epoch, words.reserved_from);
                }
                let floor = words
                    .trim
                    .max(self.tail.saturating_sub(self.layout.period()));
                self.phase = Phase::Scan {
                    floor,
                    high: self.tail,
                };
                Ok(self.scan_from(floor, self.tail))
            }
            Phase::Scan { floor, high } => {
                let (floor, scanned) = (*floor, *high);
                *high = chunk_low(floor, scanned);
                let high = *high;
                let positions = scan_chunk(floor, scanned);
                for (p, bytes) in positions.into_iter().zip(&outcome.reads) {
                    self.found(p, bytes)?;
                }
                Ok(self.scan_from(floor, high))
            }
        }
    }

    /// Keeps the streams of the data entry in the slot read for position `p`: `p` itself, or
    /// an older position of the same slot that is not trimmed. The scan covers one period
    /// below the new epoch's start, every slot once, but the start can be more than a period
    /// above the trim point (each takeover skips up to a lease of positions, and nothing
    /// may be trimmed meanwhile); a slot whose scanned position was never written (none at
    /// or above trim + period ever is) then holds an entry of an earlier lap that is still
    /// in the log, and its stream's backpointers must name it.
    fn found(&mut self, p: u64, bytes: &[u8]) -> Result<(), TakeoverError> {
        let Some(held) = held_position(bytes) else {
            return Ok(());
        };
        let older = held < p && held >= self.trim && !planted(Bug::ScanSkipsEarlierLap);
        if held != p && !older {
            return Ok(());
        }
        match peek_streams(held, bytes, self.layout.backpointers) {
            Ok(Some(streams)) if !streams.is_empty() => {
                let found = if older {
                    &mut self.older
                } else {
                    &mut self.history
                };
                found.push((held, streams));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(_) => Err(TakeoverError::Corrupt(p)),
        }
    }

    fn scan_from(&mut self, floor: u64, high: u64) -> Step<TakenOver> {
        if high > floor {
            let positions = scan_chunk(floor, high);
            return Step::Run(minitxs::headers(
                &self.layout,
                &positions,
                STREAMS_PER_ENTRY_MAX,
            ));
        }
        if planted(Bug::RegrantUnwritten) {
            if let Some((last, _)) = self.history.first() {
                self.tail = last + 1;
            }
        }
        self.done()
    }

    fn done(&mut self) -> Step<TakenOver> {
        let mut history = std::mem::take(&mut self.history);
        let mut older = std::mem::take(&mut self.older);
        older.sort_unstable_by_key(|(p, _)| std::cmp::Reverse(*p));
        history.extend(older);
        Step::Done(TakenOver {
            epoch: self.epoch,
            tail: self.tail,
            trim: self.trim,
            history,
        })
    }
}

/// The positions of the next chunk of a backward scan down to `floor`, highest first.
fn scan_chunk(floor: u64, high: u64) -> Vec<u64> {
    (chunk_low(floor, high)..high).rev().collect()
}

/// Where the chunk of a backward scan that ends below `high` begins.
fn chunk_low(floor: u64, high: u64) -> u64 {
    floor.max(high.saturating_sub(SCAN_CHUNK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Content, Entry, StreamHeader};

    fn words(trim: u64, reserved_to: u64) -> Vec<u8> {
        [crate::layout::MAGIC, 2, trim, 0, reserved_to]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    fn slot(position: u64, stream: StreamId) -> Vec<u8> {
        let entry = Entry {
            position,
            epoch: 2,
            writer: 1,
            content: Content::Data {
                streams: vec![StreamHeader {
                    stream,
                    backpointers: vec![u64::MAX; 4],
                }],
                payload: vec![],
            },
        };
        let mut bytes = entry.encode(4);
        bytes.resize(crate::entry::header_bytes(STREAMS_PER_ENTRY_MAX, 4), 0);
        bytes
    }

    /// The new epoch starts more than a period above the trim point: the slot of a
    /// never-written position holds an entry of the lap before, which is still in the log.
    #[test]
    fn entries_of_an_earlier_lap_below_the_scanned_period_are_found() {
        // Two nodes of 4 slots: a period of 8. Trim 1, the old reservation ends at 12.
        let layout = LogLayout {
            nodes: vec![(1, 0), (2, 0)],
            slot_bytes: 1024,
            slots_per_node: 4,
            backpointers: 4,
        };
        let (mut t, _) = Takeover::start(&layout, 3);
        let sealed = Outcome {
            committed: true,
            reads: vec![words(1, 12), words(1, 12)],
            failed_compares: vec![],
        };
        let Ok(Step::Run(scan)) = t.on_outcome(&sealed) else {
            panic!("a scan follows the seal");
        };
        assert_eq!(scan.items().len(), 8, "one period, 11 down to 4");
        // 11's slot holds 3 (11 was never written), 10 holds itself, 9's slot holds 1 (at
        // the trim point: still in the log), 8's holds 0 (trimmed); the rest are empty.
        let mut reads = vec![vec![0; 1024]; 8];
        reads[0] = slot(3, 5);
        reads[1] = slot(10, 6);
        reads[2] = slot(1, 7);
        reads[3] = slot(0, 8);
        let scanned = Outcome {
            committed: true,
            reads,
            failed_compares: vec![],
        };
        let Ok(Step::Done(taken)) = t.on_outcome(&scanned) else {
            panic!("one chunk covers the period");
        };
        assert_eq!((taken.tail, taken.trim), (12, 1));
        assert_eq!(
            taken.history,
            vec![(10, vec![6]), (3, vec![5]), (1, vec![7])],
            "newest first; 0 is trimmed"
        );
    }
}
