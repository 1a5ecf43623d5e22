//! Catching up with one stream (Tango §5): learn the stream's last positions from the
//! sequencer, read them in parallel, follow each entry's K backpointers back to where the
//! previous sync stopped, and scan the log backwards where every backpointer leads to junk.
//! Sans-I/O: the driver reads the positions asked for (filling holes) and hands back what
//! each holds; the simulator drives the same steps.

use crate::entry::StreamId;
use crate::error::LogError;
use crate::layout::LogLayout;
use crate::minitxs;
use crate::read::Found;
use crate::{planted, Bug};
use std::collections::{BTreeMap, BTreeSet};
use tutti_client::Outcome;
use tutti_wire::{Answer, Ask};

/// Positions read per step of a backward scan.
pub const SCAN_READS: u64 = 64;

#[derive(Debug)]
pub enum SyncStep {
    /// Ask the sequencer (with `min_epoch` from `Sync::min_epoch`).
    Ask(Ask),
    /// Run any one of these read-only minitransactions (the log's epoch on each node,
    /// `minitxs::epoch`) and hand back its outcome (`Sync::on_fenced`): the sequencer's
    /// answer counts only if its epoch is still the log's.
    Fence(Vec<tutti_client::Minitx>),
    /// Read these positions (in parallel, filling holes) and hand back what each holds.
    Read(Vec<u64>),
    /// The stream's entries from the floor up to `tail`, in log order. `trimmed`: the log
    /// was found trimmed at that position, above the floor: the entries between the floor
    /// and it are gone and not in `entries`.
    Done {
        tail: u64,
        entries: BTreeMap<u64, Vec<u8>>,
        trimmed: Option<u64>,
    },
}

/// One sync of a stream from `floor` (every entry below it is known already) to the tail.
#[derive(Debug)]
pub struct Sync {
    stream: StreamId,
    k: usize,
    floor: u64,
    tail: u64,
    /// Every position of the stream in [covered, tail) is in `visited` or being read.
    covered: u64,
    visited: BTreeSet<u64>,
    entries: BTreeMap<u64, Vec<u8>>,
    min_epoch: u64,
    /// The floor the sync started from.
    start: u64,
    /// The sequencer's answer, waiting for the fence: its epoch and backpointers.
    answered: Option<(u64, Vec<u64>)>,
}

impl Sync {
    pub fn new(stream: StreamId, k: u8, floor: u64) -> (Sync, SyncStep) {
        let s = Sync {
            stream,
            k: usize::from(k),
            floor,
            tail: floor,
            covered: floor,
            visited: BTreeSet::new(),
            entries: BTreeMap::new(),
            min_epoch: 0,
            start: floor,
            answered: None,
        };
        let ask = s.ask();
        (s, ask)
    }

    pub fn min_epoch(&self) -> u64 {
        self.min_epoch
    }

    fn ask(&self) -> SyncStep {
        SyncStep::Ask(Ask::Tail {
            streams: vec![self.stream],
        })
    }

    /// Where a list of backpointers (the stream's positions before some position, newest
    /// first) leaves the covered range: a full list covers down to its oldest; a shorter one
    /// says the stream has no earlier position.
    fn covers(&self, backpointers: &[u64]) -> u64 {
        if backpointers.len() < self.k {
            self.floor
        } else {
            backpointers[self.k - 1].max(self.floor)
        }
    }

    pub fn on_answer(&mut self, layout: &LogLayout, answer: Answer) -> Result<SyncStep, LogError> {
        match answer {
            Answer::Tail {
                tail,
                epoch,
                mut last,
            } => {
                let last = last.pop().unwrap_or_default();
                self.tail = tail.max(self.floor);
                if planted(Bug::UnfencedTail) {
                    self.covered = self.covers(&last);
                    return Ok(self.next(last));
                }
                self.answered = Some((epoch, last));
                Ok(SyncStep::Fence(minitxs::epoch(layout)))
            }
            Answer::Sealed { epoch } => {
                self.min_epoch = self.min_epoch.max(epoch + 1);
                Ok(self.ask())
            }
            other => Err(LogError::Cluster(format!(
                "the sequencer answered a fast check with {other:?}"
            ))),
        }
    }

    /// The outcome of the `Fence`: a log at a later epoch than the answer's means the
    /// sequencer that gave it was replaced, and may not know of entries appended since;
    /// ask again, of a sequencer at that epoch or later.
    pub fn on_fenced(&mut self, outcome: &Outcome) -> SyncStep {
        let (epoch, last) = self.answered.take().expect("an answer to fence");
        let log_epoch = minitxs::epoch_result(outcome);
        if log_epoch > epoch {
            self.min_epoch = self.min_epoch.max(log_epoch);
            self.tail = self.floor;
            return self.ask();
        }
        self.covered = self.covers(&last);
        self.next(last)
    }

    /// What the positions of the last `Read` hold.
    pub fn on_found(&mut self, found: Vec<(u64, Found)>) -> SyncStep {
        let mut more = Vec::new();
        for (position, f) in found {
            if let Found::Trimmed { trim } = f {
                self.floor = self.floor.max(trim);
                self.covered = self.covered.max(self.floor);
            }
            let Found::Data { streams, payload } = f else {
                continue;
            };
            let Some(header) = streams.iter().find(|h| h.stream == self.stream) else {
                continue;
            };
            self.covered = self.covered.min(self.covers(&header.backpointers));
            more.extend_from_slice(&header.backpointers);
            self.entries.insert(position, payload);
        }
        self.entries = self.entries.split_off(&self.floor);
        self.next(more)
    }

    /// Reads the candidates not yet read, and scans back below the covered range (if it
    /// does not reach the floor yet) where they do not lead further down than a scan would:
    /// none is left (junk broke the backpointers), or they lie within `SCAN_READS` of it (a
    /// dense stream, whose walk takes a round trip per K entries: under `tutti chaos
    /// --workload log`, a reader restarted far behind the tail of a stream of every third
    /// entry took most of the run to catch up, holding back every trim).
    fn next(&mut self, candidates: Vec<u64>) -> SyncStep {
        let mut read: Vec<u64> = candidates
            .into_iter()
            .filter(|&p| p >= self.floor && p < self.tail && self.visited.insert(p))
            .collect();
        let dense = (read.iter().max()).is_none_or(|&p| p < self.covered + SCAN_READS);
        if dense && self.covered > self.floor {
            let low = self.floor.max(self.covered.saturating_sub(SCAN_READS));
            read.extend(
                (low..self.covered)
                    .rev()
                    .filter(|&p| self.visited.insert(p)),
            );
            self.covered = low;
        }
        if read.is_empty() {
            return SyncStep::Done {
                tail: self.tail,
                entries: std::mem::take(&mut self.entries),
                trimmed: (self.floor > self.start).then_some(self.floor),
            };
        }
        SyncStep::Read(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::StreamHeader;

    /// A log in memory: position → (streams with their backpointers, payload) or junk.
    struct Log {
        k: u8,
        slots: BTreeMap<u64, Option<Vec<StreamHeader>>>,
        tail: u64,
        last: BTreeMap<StreamId, Vec<u64>>,
    }

    impl Log {
        fn new(k: u8) -> Log {
            Log {
                k,
                slots: BTreeMap::new(),
                tail: 0,
                last: BTreeMap::new(),
            }
        }

        /// Appends to `streams`; `junk` makes the write fail and the hole be filled.
        fn append(&mut self, streams: &[StreamId], junk: bool) -> u64 {
            let p = self.tail;
            self.tail += 1;
            let headers = streams
                .iter()
                .map(|s| {
                    let last = self.last.entry(*s).or_default();
                    let backpointers = last.clone();
                    last.insert(0, p);
                    last.truncate(usize::from(self.k));
                    StreamHeader {
                        stream: *s,
                        backpointers,
                    }
                })
                .collect();
            self.slots.insert(p, (!junk).then_some(headers));
            p
        }

        fn found(&self, p: u64) -> Found {
            match &self.slots[&p] {
                Some(streams) => Found::Data {
                    streams: streams.clone(),
                    payload: p.to_le_bytes().to_vec(),
                },
                None => Found::Junk,
            }
        }

        fn sync(&self, stream: StreamId, floor: u64) -> (Vec<u64>, usize) {
            self.sync_at_epoch(stream, floor, 1)
        }

        /// A sync whose first answer comes from a sequencer at `first_epoch` (the log's is
        /// 1): one replaced by then, if higher... or a stale one, if lower.
        fn sync_at_epoch(
            &self,
            stream: StreamId,
            floor: u64,
            first_epoch: u64,
        ) -> (Vec<u64>, usize) {
            let layout = LogLayout {
                nodes: vec![(1, 0)],
                slot_bytes: 256,
                slots_per_node: 1024,
                backpointers: self.k,
            };
            let (mut s, mut step) = Sync::new(stream, self.k, floor);
            let (mut reads, mut epoch) = (0, first_epoch);
            loop {
                step = match step {
                    SyncStep::Ask(_) if epoch < 1 => {
                        epoch = 1;
                        s.on_answer(
                            &layout,
                            Answer::Tail {
                                tail: floor,
                                epoch: 0,
                                last: vec![vec![]],
                            },
                        )
                        .expect("a tail")
                    }
                    SyncStep::Ask(_) => s
                        .on_answer(
                            &layout,
                            Answer::Tail {
                                tail: self.tail,
                                epoch: 1,
                                last: vec![self.last.get(&stream).cloned().unwrap_or_default()],
                            },
                        )
                        .expect("a tail"),
                    SyncStep::Fence(_) => s.on_fenced(&tutti_client::Outcome {
                        committed: true,
                        reads: vec![1u64.to_le_bytes().to_vec()],
                        failed_compares: vec![],
                    }),
                    SyncStep::Read(ps) => {
                        reads += 1;
                        s.on_found(ps.into_iter().map(|p| (p, self.found(p))).collect())
                    }
                    SyncStep::Done { entries, .. } => {
                        return (entries.into_keys().collect(), reads)
                    }
                }
            }
        }
    }

    #[test]
    fn a_sync_finds_every_entry_of_the_stream_striding_k_at_a_time() {
        let mut log = Log::new(4);
        let mut mine = Vec::new();
        for i in 0..100 {
            log.append(&[9], false);
            if i % 3 == 0 {
                mine.push(log.append(&[1, 9], false));
            }
        }
        let (found, reads) = log.sync(1, 0);
        assert_eq!(found, mine);
        assert!(reads <= mine.len() / 4 + 2, "{reads} rounds of reads");
        let (later, _) = log.sync(1, mine[20]);
        assert_eq!(later, mine[20..].to_vec());
    }

    /// A replaced sequencer still answers with the tail it knew; the fence sends the sync
    /// to ask again, and it finds what was appended since.
    /// A dense stream far below the tail is scanned a chunk per round trip, not walked K
    /// entries at a time; a sparse one is walked, not scanned.
    #[test]
    fn a_dense_stream_is_scanned_and_a_sparse_one_walked() {
        let mut log = Log::new(4);
        let mut dense = Vec::new();
        let mut sparse = Vec::new();
        for i in 0..6000 {
            if i % 3 == 0 {
                dense.push(log.append(&[1], false));
            } else if i % 1000 == 1 {
                sparse.push(log.append(&[2], false));
            } else {
                log.append(&[9], false);
            }
        }
        let (found, reads) = log.sync(1, 0);
        assert_eq!(found, dense);
        let scans = 6000 / SCAN_READS as usize;
        assert!(reads <= scans + 4, "{reads} rounds for {scans} scans");
        let (found, reads) = log.sync(2, 0);
        assert_eq!(found, sparse);
        assert!(reads <= 3, "{reads} rounds for 6 entries");
    }

    #[test]
    fn a_stale_sequencers_tail_is_fenced_off() {
        let mut log = Log::new(2);
        let mine: Vec<u64> = (0..6).map(|_| log.append(&[5], false)).collect();
        let (found, _) = log.sync_at_epoch(5, 0, 0);
        assert_eq!(found, mine);
    }

    #[test]
    fn junk_that_breaks_every_backpointer_is_scanned_past() {
        let mut log = Log::new(2);
        let early: Vec<u64> = (0..5).map(|_| log.append(&[3], false)).collect();
        for _ in 0..200 {
            log.append(&[4], false);
        }
        log.append(&[3], true);
        log.append(&[3], true);
        let late = log.append(&[3], false);
        let (found, _) = log.sync(3, 0);
        let mut expected = early;
        expected.push(late);
        assert_eq!(found, expected);
    }

    #[test]
    fn a_stream_never_appended_to_syncs_to_nothing() {
        let mut log = Log::new(4);
        log.append(&[1], false);
        assert_eq!(log.sync(2, 0), (vec![], 0));
    }
}
