//! Reading one position as sans-I/O steps: read the slot; if it is unwritten, learn the
//! tail; below the tail it is a hole, which the reader waits out (the hole timeout) and
//! then fills with junk (CORFU's fill), so that a client that crashed after taking a
//! position cannot stall every reader. The appender whose position was filled takes another.

use crate::entry::{Content, Decoded, Entry, StreamHeader};
use crate::error::LogError;
use crate::layout::LogLayout;
use crate::minitxs::{self, Refusal, READ_PREFIX_BYTES};
use std::time::Duration;
use tutti_client::{Minitx, Outcome};
use tutti_wire::{Answer, Ask};

/// What a position holds, as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Data {
        streams: Vec<StreamHeader>,
        payload: Vec<u8>,
    },
    /// A filled hole.
    Junk,
    /// Below the log's trim point: gone.
    Trimmed { trim: u64 },
    /// Below the tail but not written (only with `Hole::Report`).
    Empty,
}

impl Found {
    pub fn state(&self) -> &'static str {
        match self {
            Found::Data { .. } => "data",
            Found::Junk => "junk",
            Found::Trimmed { .. } => "trimmed",
            Found::Empty => "empty",
        }
    }
}

/// What a read does with an unwritten position below the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hole {
    /// Wait this long for its writer, then fill it (CORFU's hole timeout).
    FillAfter(Duration),
    /// Fill it at once (`fill`).
    FillNow,
    /// Report it as `Found::Empty`.
    Report,
}

/// The hole timeout of Tango §3 ("100ms by default").
pub const HOLE_TIMEOUT_DEFAULT: Duration = Duration::from_millis(100);
/// Within the hole timeout a read looks again, first after this long, then after twice as
/// long each time up to `HOLE_POLL_MAX`: a position below the tail is most often an append
/// still in flight, written within a millisecond, and a reader that slept the whole
/// timeout before looking again held every play behind it for 100 ms.
pub const HOLE_POLL_FIRST: Duration = Duration::from_micros(100);
pub const HOLE_POLL_MAX: Duration = Duration::from_millis(2);

#[derive(Debug)]
pub enum ReadStep {
    /// Run this read-only minitransaction.
    Read(Minitx),
    /// Ask the sequencer (with `min_epoch` from `ReadAt::min_epoch`).
    Ask(Ask),
    /// Sleep this long, then call `on_waited`.
    Wait(Duration),
    /// Run this fill (a junk write); if its outcome is unknown, run it again.
    Fill(Minitx),
    Done(Found),
}

#[derive(Debug)]
pub struct ReadAt {
    position: u64,
    hole: Hole,
    /// The epoch to fill in, once the sequencer said it.
    epoch: Option<u64>,
    min_epoch: u64,
    /// How long it has waited for the hole's writer, and its next pause.
    waited: Duration,
    pause: Duration,
}

impl ReadAt {
    pub fn new(layout: &LogLayout, position: u64, hole: Hole) -> (ReadAt, ReadStep) {
        let r = ReadAt {
            position,
            hole,
            epoch: None,
            min_epoch: 0,
            waited: Duration::ZERO,
            pause: HOLE_POLL_FIRST,
        };
        let step = r.read(layout, READ_PREFIX_BYTES);
        (r, step)
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn min_epoch(&self) -> u64 {
        self.min_epoch
    }

    fn read(&self, layout: &LogLayout, len: u32) -> ReadStep {
        ReadStep::Read(minitxs::read(layout, self.position, len))
    }

    fn fill(&self, layout: &LogLayout, epoch: u64) -> ReadStep {
        let junk = Entry {
            position: self.position,
            epoch,
            writer: 0,
            content: Content::Junk,
        };
        ReadStep::Fill(minitxs::write(layout, epoch, &junk))
    }

    pub fn on_read(&mut self, layout: &LogLayout, outcome: &Outcome) -> Result<ReadStep, LogError> {
        let (epoch, trim, bytes) = minitxs::read_result(outcome);
        // A sequencer below the node's epoch was sealed: the tail it would tell is stale.
        self.min_epoch = self.min_epoch.max(epoch);
        let p = self.position;
        if p < trim {
            return Ok(ReadStep::Done(Found::Trimmed { trim }));
        }
        match Entry::decode(p, bytes, layout.backpointers, layout.slot_bytes) {
            Ok(Some(entry)) => Ok(ReadStep::Done(match entry.content {
                Content::Data { streams, payload } => Found::Data { streams, payload },
                Content::Junk => Found::Junk,
            })),
            Ok(None) => Ok(match (self.hole, self.epoch) {
                (Hole::Report, Some(_)) => ReadStep::Done(Found::Empty),
                (Hole::FillAfter(timeout), Some(_)) if self.waited < timeout => {
                    let pause = self.pause.min(timeout - self.waited);
                    self.waited += pause;
                    self.pause = (self.pause * 2).min(HOLE_POLL_MAX);
                    ReadStep::Wait(pause)
                }
                (Hole::FillAfter(_), Some(_))
                    if crate::planted(crate::Bug::SkipHoleWithoutFill) =>
                {
                    ReadStep::Done(Found::Junk)
                }
                (_, Some(epoch)) => self.fill(layout, epoch),
                (_, None) => ReadStep::Ask(Ask::Tail { streams: vec![] }),
            }),
            Err(Decoded::Need(len)) => Ok(self.read(layout, len as u32)),
            Err(Decoded::Corrupt(e)) => Err(LogError::Corrupt(p, e.to_string())),
        }
    }

    /// The sequencer's answer to a fast check: is the position below the tail?
    pub fn on_answer(&mut self, layout: &LogLayout, answer: Answer) -> Result<ReadStep, LogError> {
        match answer {
            Answer::Tail { tail, epoch, .. } => {
                if self.position >= tail {
                    return Err(LogError::PastTail {
                        position: self.position,
                        tail,
                    });
                }
                self.epoch = Some(epoch);
                // Read again: the writer may have finished meanwhile.
                Ok(self.read(layout, READ_PREFIX_BYTES))
            }
            Answer::Sealed { epoch } => {
                self.min_epoch = self.min_epoch.max(epoch + 1);
                Ok(ReadStep::Ask(Ask::Tail { streams: vec![] }))
            }
            other => Err(LogError::Cluster(format!(
                "the sequencer answered a fast check with {other:?}"
            ))),
        }
    }

    pub fn on_waited(&mut self, layout: &LogLayout) -> ReadStep {
        self.read(layout, READ_PREFIX_BYTES)
    }

    pub fn on_fill(&mut self, layout: &LogLayout, outcome: &Outcome) -> Result<ReadStep, LogError> {
        if outcome.committed {
            return Ok(ReadStep::Done(Found::Junk));
        }
        let epoch = self.epoch.unwrap_or_default();
        match minitxs::write_refusal(layout, self.position, epoch, outcome) {
            // Its writer (or another reader's fill) got there first.
            Refusal::Taken { .. } => Ok(self.read(layout, READ_PREFIX_BYTES)),
            Refusal::Trimmed { trim } => Ok(ReadStep::Done(Found::Trimmed { trim })),
            Refusal::Sealed { epoch } => {
                self.min_epoch = self.min_epoch.max(epoch);
                self.epoch = None;
                Ok(ReadStep::Ask(Ask::Tail { streams: vec![] }))
            }
            Refusal::Full { trim } => Err(LogError::Full {
                position: self.position,
                trim,
            }),
        }
    }
}
