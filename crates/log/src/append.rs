//! One append (Tango's multiappend when the entry has several streams) as sans-I/O steps:
//! ask the sequencer for a position, write the slot with the write-once minitransaction
//! (batched with other appends' writes to the same node, `batch`), and take a new position
//! when the slot went to someone else (a reader's fill) or the log moved to a new epoch. The
//! driver runs the steps; the simulator drives the same ones.

use crate::entry::{check_fits, Content, Entry, StreamHeader, StreamId};
use crate::error::LogError;
use crate::layout::LogLayout;
use crate::minitxs::{Refusal, SlotWrite, Written};
use crate::read::Found;
use tutti_wire::{Answer, Ask};

/// What the driver does next.
#[derive(Debug)]
pub enum AppendStep {
    /// Ask the log's sequencer (with `min_epoch` from `Append::min_epoch`).
    Ask(Ask),
    /// Write the entry to its slot (through a `Batcher`); hand back what became of it. A
    /// write whose outcome is unknown is written again: it is idempotent.
    Write(SlotWrite),
    /// The entry is at this position.
    Done(u64),
}

#[derive(Debug)]
pub struct Append {
    entry: Entry,
    streams: Vec<StreamId>,
    /// The highest epoch the nodes refused this append at: a sequencer older than that
    /// is superseded.
    min_epoch: u64,
}

impl Append {
    /// An append of `payload` to `streams` by `writer` (a number drawn for this append, so
    /// that a retried write recognises its own entry). Checks that it fits a slot first.
    pub fn new(
        layout: &LogLayout,
        streams: &[StreamId],
        payload: Vec<u8>,
        writer: u64,
    ) -> Result<(Append, AppendStep), LogError> {
        check_fits(
            streams,
            payload.len(),
            layout.slot_bytes,
            layout.backpointers,
        )?;
        let append = Append {
            entry: Entry {
                position: 0,
                epoch: 0,
                writer,
                content: Content::Data {
                    streams: streams
                        .iter()
                        .map(|&stream| StreamHeader {
                            stream,
                            backpointers: Vec::new(),
                        })
                        .collect(),
                    payload,
                },
            },
            streams: streams.to_vec(),
            min_epoch: 0,
        };
        let ask = append.ask();
        Ok((append, ask))
    }

    pub fn min_epoch(&self) -> u64 {
        self.min_epoch
    }

    /// The number this append writes under (`Entry::writer`).
    pub fn writer(&self) -> u64 {
        self.entry.writer
    }

    /// What a read of its position finds once it is written.
    pub fn found(&self) -> Found {
        match &self.entry.content {
            Content::Data { streams, payload } => Found::Data {
                streams: streams.clone(),
                payload: payload.clone(),
            },
            Content::Junk => Found::Junk,
        }
    }

    /// The position being written, once one was granted.
    pub fn position(&self) -> u64 {
        self.entry.position
    }

    fn ask(&self) -> AppendStep {
        AppendStep::Ask(Ask::Next {
            streams: self.streams.clone(),
        })
    }

    pub fn on_answer(
        &mut self,
        layout: &LogLayout,
        answer: Answer,
    ) -> Result<AppendStep, LogError> {
        match answer {
            Answer::Granted {
                position,
                epoch,
                backpointers,
            } => {
                if backpointers.len() != self.streams.len() {
                    return Err(LogError::Cluster(format!(
                        "the sequencer gave {} backpointer lists for {} streams",
                        backpointers.len(),
                        self.streams.len()
                    )));
                }
                self.entry.position = position;
                self.entry.epoch = epoch;
                if let Content::Data { streams, .. } = &mut self.entry.content {
                    for (header, bps) in streams.iter_mut().zip(backpointers) {
                        header.backpointers = bps;
                    }
                }
                Ok(self.write(layout))
            }
            Answer::Sealed { epoch } => {
                self.min_epoch = self.min_epoch.max(epoch + 1);
                Ok(self.ask())
            }
            Answer::TooManyStreams(n) => {
                Err(crate::entry::EntryError::TooManyStreams(n as usize).into())
            }
            Answer::Full { position, trim } => Err(LogError::Full { position, trim }),
            Answer::Tail { .. } => Err(LogError::Cluster(
                "the sequencer answered a request for a position with the tail".into(),
            )),
        }
    }

    fn write(&self, layout: &LogLayout) -> AppendStep {
        AppendStep::Write(SlotWrite::new(layout, self.entry.epoch, &self.entry))
    }

    /// What became of the write.
    pub fn on_written(
        &mut self,
        layout: &LogLayout,
        written: Written,
    ) -> Result<AppendStep, LogError> {
        let position = self.entry.position;
        match written {
            Written::Done => Ok(AppendStep::Done(position)),
            Written::Again | Written::Unknown => Ok(self.write(layout)),
            Written::Refused(Refusal::Taken { writer }) if writer == self.entry.writer => {
                Ok(AppendStep::Done(position))
            }
            Written::Refused(Refusal::Taken { .. } | Refusal::Trimmed { .. }) => Ok(self.ask()),
            Written::Refused(Refusal::Sealed { epoch }) => {
                self.min_epoch = self.min_epoch.max(epoch);
                Ok(self.ask())
            }
            Written::Refused(Refusal::Full { trim }) => Err(LogError::Full { position, trim }),
        }
    }
}
