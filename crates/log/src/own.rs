//! The entries this client's appends wrote, so that its own reads of them need no memory
//! node: a position is written once, so what an acknowledged append wrote there is what any
//! read finds until the position is trimmed. A read of a position that one of this client's
//! appends is still writing waits for that append instead of polling a locked or empty slot.
//! Sans-I/O: the async client and the simulator keep one each and tell it every append step.

use crate::append::{Append, AppendStep};
use crate::read::Found;
use crate::{planted, Bug};
use std::collections::BTreeMap;

/// Entries kept, at most, and their payload bytes, at most: the newest stay. A play reads
/// what was appended since the last one, a few thousand entries at most under load.
pub const OWN_ENTRIES_MAX: usize = 4096;
pub const OWN_BYTES_MAX: usize = 8 << 20;

/// What this client knows of a position it was asked to read.
#[derive(Debug, PartialEq, Eq)]
pub enum Own {
    /// One of its appends wrote this there.
    Found(Found),
    /// One of its appends is writing it: wait to be woken, then look again.
    Wait,
    /// Nothing: read it from the memory nodes.
    Read,
}

#[derive(Debug)]
pub struct OwnEntries<W> {
    /// The position each append under way holds (by its writer number).
    held: BTreeMap<u64, u64>,
    /// Positions held by appends under way, with the reads waiting on each.
    under_way: BTreeMap<u64, Vec<W>>,
    written: BTreeMap<u64, Found>,
    bytes: usize,
}

impl<W> Default for OwnEntries<W> {
    fn default() -> Self {
        OwnEntries {
            held: BTreeMap::new(),
            under_way: BTreeMap::new(),
            written: BTreeMap::new(),
            bytes: 0,
        }
    }
}

impl<W> OwnEntries<W> {
    /// What is known of `position`; with `Own::Wait`, `waiter` is woken when its append ends.
    pub fn look(&mut self, position: u64, waiter: impl FnOnce() -> W) -> Own {
        if let Some(found) = self.written.get(&position) {
            return Own::Found(found.clone());
        }
        match self.under_way.get_mut(&position) {
            Some(waiters) => {
                waiters.push(waiter());
                Own::Wait
            }
            None => Own::Read,
        }
    }

    /// `append` took `step` (or failed): returns the waiters of a position it wrote or gave
    /// up. Call it with every step of every append, the first included.
    pub fn on_step(&mut self, append: &Append, step: &Result<AppendStep, impl Sized>) -> Vec<W> {
        let writer = append.writer();
        match step {
            Ok(AppendStep::Write(write)) => {
                if self.held.get(&writer) == Some(&write.position) {
                    return Vec::new();
                }
                let woken = self.give_up(append);
                self.held.insert(writer, write.position);
                self.under_way.entry(write.position).or_default();
                woken
            }
            Ok(AppendStep::Done(position)) => {
                self.held.remove(&writer);
                self.keep(*position, append.found());
                self.under_way.remove(position).unwrap_or_default()
            }
            Ok(AppendStep::Ask(_)) | Err(_) => self.give_up(append),
        }
    }

    /// The append no longer writes the position it held (another entry took it, the log
    /// moved on, or it failed): readers must look at the slot itself.
    fn give_up(&mut self, append: &Append) -> Vec<W> {
        let Some(position) = self.held.remove(&append.writer()) else {
            return Vec::new();
        };
        if planted(Bug::OwnEntryKeptWhenMoved) {
            self.keep(position, append.found());
        }
        self.under_way.remove(&position).unwrap_or_default()
    }

    fn keep(&mut self, position: u64, found: Found) {
        self.bytes += payload_bytes(&found);
        if let Some(old) = self.written.insert(position, found) {
            self.bytes -= payload_bytes(&old);
        }
        while self.written.len() > OWN_ENTRIES_MAX || self.bytes > OWN_BYTES_MAX {
            let (_, oldest) = self.written.pop_first().expect("not empty");
            self.bytes -= payload_bytes(&oldest);
        }
    }

    /// The log is trimmed below `trim`: its positions read as trimmed now.
    pub fn trimmed(&mut self, trim: u64) {
        while self
            .written
            .first_key_value()
            .is_some_and(|(&p, _)| p < trim)
        {
            let (_, gone) = self.written.pop_first().expect("not empty");
            self.bytes -= payload_bytes(&gone);
        }
    }
}

fn payload_bytes(found: &Found) -> usize {
    match found {
        Found::Data { payload, .. } => payload.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LogError;
    use crate::layout::LogLayout;
    use crate::minitxs::{Refusal, Written};
    use tutti_wire::Answer;

    fn layout() -> LogLayout {
        crate::layout::two_nodes(256, 1 << 16)
    }

    fn granted(position: u64) -> Answer {
        Answer::Granted {
            position,
            epoch: 1,
            backpointers: vec![vec![]],
        }
    }

    fn step_to(
        own: &mut OwnEntries<u32>,
        append: &mut Append,
        step: Result<AppendStep, LogError>,
    ) -> Vec<u32> {
        own.on_step(append, &step)
    }

    #[test]
    fn a_read_waits_for_the_append_writing_its_position_and_then_finds_its_entry() {
        let layout = layout();
        let mut own = OwnEntries::default();
        let (mut append, first) = Append::new(&layout, &[7], b"abc".to_vec(), 9).expect("fits");
        assert!(step_to(&mut own, &mut append, Ok(first)).is_empty());
        assert_eq!(own.look(5, || 1), Own::Read, "no position yet");
        let write = append.on_answer(&layout, granted(5));
        assert!(step_to(&mut own, &mut append, write).is_empty());
        assert_eq!(own.look(5, || 1), Own::Wait);
        assert_eq!(own.look(5, || 2), Own::Wait);
        let done = append.on_written(&layout, Written::Done);
        assert_eq!(step_to(&mut own, &mut append, done), vec![1, 2]);
        match own.look(5, || 3) {
            Own::Found(Found::Data { streams, payload }) => {
                assert_eq!(payload, b"abc");
                assert_eq!(streams[0].stream, 7);
            }
            other => panic!("{other:?}"),
        }
        own.trimmed(6);
        assert_eq!(own.look(5, || 4), Own::Read);
    }

    #[test]
    fn a_position_given_up_wakes_its_readers_and_keeps_nothing() {
        let layout = layout();
        let mut own = OwnEntries::default();
        let (mut append, first) = Append::new(&layout, &[7], b"abc".to_vec(), 9).expect("fits");
        step_to(&mut own, &mut append, Ok(first));
        let write = append.on_answer(&layout, granted(5));
        step_to(&mut own, &mut append, write);
        assert_eq!(own.look(5, || 1), Own::Wait);
        let taken = Written::Refused(Refusal::Taken { writer: 0 });
        let ask = append.on_written(&layout, taken);
        assert_eq!(step_to(&mut own, &mut append, ask), vec![1]);
        assert_eq!(own.look(5, || 2), Own::Read);
        let write = append.on_answer(&layout, granted(8));
        step_to(&mut own, &mut append, write);
        let done = append.on_written(&layout, Written::Done);
        step_to(&mut own, &mut append, done);
        assert_eq!(own.look(5, || 3), Own::Read);
        assert!(matches!(own.look(8, || 4), Own::Found(_)));
    }

    #[test]
    fn the_newest_entries_stay_within_the_bounds() {
        let layout = layout();
        let mut own: OwnEntries<u32> = OwnEntries::default();
        for p in 0..(OWN_ENTRIES_MAX as u64 + 10) {
            let (mut append, first) = Append::new(&layout, &[1], vec![0; 8], p + 1).expect("fits");
            step_to(&mut own, &mut append, Ok(first));
            let write = append.on_answer(&layout, granted(p));
            step_to(&mut own, &mut append, write);
            let done = append.on_written(&layout, Written::Done);
            step_to(&mut own, &mut append, done);
        }
        assert_eq!(own.look(9, || 0), Own::Read);
        assert!(matches!(own.look(10, || 0), Own::Found(_)));
        assert_eq!(own.written.len(), OWN_ENTRIES_MAX);
        assert!(own.held.is_empty() && own.under_way.is_empty());
    }
}
