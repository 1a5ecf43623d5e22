//! One log as the sequencer service serves it, sans-I/O: the frames of asks it is sent, the
//! takeover that must come first (is this still the cluster's sequencer? take the next
//! epoch from the manager, seal, find the tail, scan back; write the headers if the log's
//! creator died before it could), then the sequencer in its epoch and its reservations.
//! The tokio server (`server`) and the simulator drive it alike.

use crate::client::REGION_KIND;
use crate::layout::LogLayout;
use crate::minitxs;
use crate::sequencer::{Actions, Sequencer};
use crate::takeover::{Step, Takeover, TakeoverError};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use tutti_client::{Minitx, Outcome};
use tutti_wire::{Answer, Ask, ErrorCode, Request, Response};

/// Rounds of asking the manager for an epoch that another taker keeps winning, before the
/// waiting frames are refused.
const TAKE_ROUNDS_MAX: u32 = 8;

/// A frame of asks, numbered by the service in arrival order.
pub type FrameId = u64;

/// What the driver does.
#[derive(Debug)]
pub enum Effect {
    /// Send this to the manager; hand the reply (or the failure) to `on_manager`.
    AskManager(Request),
    /// Run this takeover step; hand its outcome to `on_outcome`. One at a time.
    Run(Minitx),
    /// Make a reservation (of `epoch`, up to `to`) durable: run `tx` until it has an outcome
    /// (it may run twice) and hand it to `on_reserved`. One at a time.
    Reserve { tx: Minitx, epoch: u64, to: u64 },
    /// Reply to the frame with one answer per ask.
    Answer(FrameId, Vec<Answer>),
    /// Reply to the frame with an error.
    Refuse(FrameId, ErrorCode, String),
}

#[derive(Debug)]
enum State {
    /// Not serving, nothing in flight.
    Idle,
    /// Is this still the cluster's sequencer?
    CheckingSequencer,
    /// The region, for its layout and epoch.
    ReadingRegion,
    /// Taking the epoch after `expect`.
    Taking { expect: u64, layout: LogLayout },
    /// Running the takeover's minitransactions at `epoch`.
    Sealing {
        layout: LogLayout,
        takeover: Takeover,
    },
    /// Writing the headers of a log whose creator died before it could.
    Creating { layout: LogLayout, epoch: u64 },
    Serving {
        layout: LogLayout,
        epoch: u64,
        seq: Sequencer<(FrameId, u32)>,
    },
}

/// A frame whose answers are not all in.
struct Unanswered {
    answers: Vec<Option<Answer>>,
    left: usize,
}

pub struct LogService {
    name: String,
    /// This sequencer's address, as the manager should name it.
    addr: String,
    lease: u64,
    state: State,
    next_frame: FrameId,
    /// Frames waiting for a takeover, with the epoch each showed.
    waiting: VecDeque<(FrameId, u64, Vec<Ask>)>,
    unanswered: FxHashMap<FrameId, Unanswered>,
    take_rounds: u32,
}

/// The most of a log's period that one reservation takes: every replacement of the sequencer
/// leaves up to a lease of holes that only a trim gives back, so a lease near the period
/// (a small log) left the log full after one restart.
const LEASE_PERIOD_SHARE: u64 = 16;

/// The lease a sequencer of a log with `period` positions uses: `lease`, at most a
/// `LEASE_PERIOD_SHARE`th of the period (the default 4,096 is a 16th of a default log on 4
/// nodes).
fn lease_for(lease: u64, period: u64) -> u64 {
    lease.min(period / LEASE_PERIOD_SHARE).max(1)
}

impl LogService {
    pub fn new(name: String, addr: String, lease: u64) -> LogService {
        LogService {
            name,
            addr,
            lease,
            state: State::Idle,
            next_frame: 0,
            waiting: VecDeque::new(),
            unanswered: FxHashMap::default(),
            take_rounds: 0,
        }
    }

    /// The epoch served, if the log is taken over.
    pub fn epoch(&self) -> Option<u64> {
        match &self.state {
            State::Serving { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    /// A frame of asks from a client that saw the log at `min_epoch`.
    pub fn on_frame(&mut self, min_epoch: u64, asks: Vec<Ask>) -> (FrameId, Vec<Effect>) {
        let frame = self.next_frame;
        self.next_frame += 1;
        let mut effects = Vec::new();
        if asks.is_empty() {
            effects.push(Effect::Answer(frame, vec![]));
        } else {
            self.serve(frame, min_epoch, asks, &mut effects);
        }
        (frame, effects)
    }

    fn serve(&mut self, frame: FrameId, min_epoch: u64, asks: Vec<Ask>, effects: &mut Vec<Effect>) {
        if let State::Serving { epoch, seq, .. } = &mut self.state {
            if min_epoch <= *epoch {
                let acts = on_asks(seq, &mut self.unanswered, frame, asks);
                self.apply(acts, effects);
                return;
            }
            // A later epoch was sealed by someone else: this sequencer's is over.
            let acts = seq.on_sealed();
            self.apply(acts, effects);
            self.state = State::Idle;
        }
        self.waiting.push_back((frame, min_epoch, asks));
        if matches!(self.state, State::Idle) {
            self.take_rounds = 0;
            effects.push(self.check_sequencer());
        }
    }

    fn check_sequencer(&mut self) -> Effect {
        self.state = State::CheckingSequencer;
        Effect::AskManager(Request::Sequencer)
    }

    /// The manager's reply to the last `AskManager`, or why there is none.
    pub fn on_manager(&mut self, reply: Result<Response, (ErrorCode, String)>) -> Vec<Effect> {
        let resp = match reply {
            Ok(resp) => resp,
            Err((code, message)) => return self.refuse_waiting(code, message),
        };
        match (std::mem::replace(&mut self.state, State::Idle), resp) {
            (State::CheckingSequencer, Response::Sequencer(Some(addr))) if addr == self.addr => {
                self.state = State::ReadingRegion;
                vec![Effect::AskManager(Request::Region {
                    name: self.name.clone(),
                })]
            }
            (State::CheckingSequencer, Response::Sequencer(other)) => {
                let message = format!(
                    "this sequencer ({}) was replaced: the manager names {other:?}",
                    self.addr
                );
                self.refuse_waiting(ErrorCode::Conflict, message)
            }
            (State::ReadingRegion, Response::Region(r)) if r.kind == REGION_KIND => {
                match LogLayout::from_region(r.nodes, &r.params) {
                    Ok(layout) => {
                        self.state = State::Taking {
                            expect: r.epoch,
                            layout,
                        };
                        vec![Effect::AskManager(Request::TakeRegion {
                            name: self.name.clone(),
                            expect: r.epoch,
                            holder: self.addr.clone(),
                        })]
                    }
                    Err(e) => self.refuse_waiting(ErrorCode::BadRequest, e.to_string()),
                }
            }
            (State::ReadingRegion, Response::Region(r)) => {
                let message = format!("region {:?} is a {}, not a log", self.name, r.kind);
                self.refuse_waiting(ErrorCode::BadRequest, message)
            }
            (State::Taking { expect, layout }, Response::Region(r))
                if r.epoch == expect + 1 && r.holder.as_deref() == Some(&self.addr) =>
            {
                let (takeover, seal) = Takeover::start(&layout, r.epoch);
                self.state = State::Sealing { layout, takeover };
                vec![Effect::Run(seal)]
            }
            // Another taker got that epoch: start again from the region as it is now.
            (State::Taking { .. }, Response::Region(_)) => self.again(),
            (_, other) => {
                let message = format!("the manager answered {other:?}");
                self.refuse_waiting(ErrorCode::NotReady, message)
            }
        }
    }

    /// Another round of taking an epoch, or the end of trying.
    fn again(&mut self) -> Vec<Effect> {
        self.take_rounds += 1;
        if self.take_rounds > TAKE_ROUNDS_MAX {
            let message = format!("lost the log's epoch to other takers {TAKE_ROUNDS_MAX} times");
            return self.refuse_waiting(ErrorCode::Conflict, message);
        }
        vec![self.check_sequencer()]
    }

    /// The outcome of the last `Run`, or why there is none (the deadline passed).
    pub fn on_outcome(&mut self, outcome: Result<Outcome, String>) -> Vec<Effect> {
        let outcome = match outcome {
            Ok(o) => o,
            Err(why) => return self.refuse_waiting(ErrorCode::NotReady, why),
        };
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Sealing {
                layout,
                mut takeover,
            } => match takeover.on_outcome(&outcome) {
                Ok(Step::Run(tx)) => {
                    self.state = State::Sealing { layout, takeover };
                    vec![Effect::Run(tx)]
                }
                Ok(Step::Done(t)) => {
                    let (seq, r) = Sequencer::start(
                        t.epoch,
                        (t.tail, t.trim, layout.period()),
                        layout.backpointers,
                        lease_for(self.lease, layout.period()),
                        t.history,
                    );
                    let mut effects = vec![Effect::Reserve {
                        tx: minitxs::reserve(&layout, &r),
                        epoch: r.epoch,
                        to: r.to,
                    }];
                    self.state = State::Serving {
                        layout,
                        epoch: t.epoch,
                        seq,
                    };
                    for (frame, min_epoch, asks) in std::mem::take(&mut self.waiting) {
                        self.serve(frame, min_epoch, asks, &mut effects);
                    }
                    effects
                }
                Err(TakeoverError::NotALog(0)) => {
                    let epoch = takeover.epoch();
                    let create = minitxs::create(&layout);
                    self.state = State::Creating { layout, epoch };
                    vec![Effect::Run(create)]
                }
                Err(TakeoverError::Superseded(_)) => self.again(),
                Err(e) => self.refuse_waiting(ErrorCode::BadRequest, e.to_string()),
            },
            State::Creating { layout, epoch } => {
                let (takeover, seal) = Takeover::start(&layout, epoch);
                self.state = State::Sealing { layout, takeover };
                vec![Effect::Run(seal)]
            }
            other => {
                self.state = other;
                vec![]
            }
        }
    }

    /// The outcome of the `Reserve` of `epoch` up to `to` (not committed: the log's epoch
    /// moved on). One of an epoch no longer served is ignored.
    pub fn on_reserved(&mut self, epoch: u64, to: u64, outcome: &Outcome) -> Vec<Effect> {
        let State::Serving {
            seq, epoch: now, ..
        } = &mut self.state
        else {
            return vec![];
        };
        if *now != epoch {
            return vec![];
        }
        let acts = if outcome.committed {
            seq.on_reserved(to, minitxs::reserve_result(outcome))
        } else {
            seq.on_sealed()
        };
        let mut effects = Vec::new();
        self.apply(acts, &mut effects);
        effects
    }

    fn apply(&mut self, acts: Actions<(FrameId, u32)>, effects: &mut Vec<Effect>) {
        if let (Some(r), State::Serving { layout, .. }) = (acts.reserve, &self.state) {
            effects.push(Effect::Reserve {
                tx: minitxs::reserve(layout, &r),
                epoch: r.epoch,
                to: r.to,
            });
        }
        for ((frame, i), answer) in acts.answers {
            let Some(u) = self.unanswered.get_mut(&frame) else {
                continue;
            };
            u.answers[i as usize] = Some(answer);
            u.left -= 1;
            if u.left == 0 {
                let u = self.unanswered.remove(&frame).expect("present");
                let answers = u
                    .answers
                    .into_iter()
                    .map(|a| a.expect("answered"))
                    .collect();
                effects.push(Effect::Answer(frame, answers));
            }
        }
    }

    fn refuse_waiting(&mut self, code: ErrorCode, message: String) -> Vec<Effect> {
        self.state = State::Idle;
        (self.waiting.drain(..))
            .map(|(frame, ..)| Effect::Refuse(frame, code, message.clone()))
            .collect()
    }
}

/// Feeds a frame's asks to the sequencer, numbering each by its frame and place.
fn on_asks(
    seq: &mut Sequencer<(FrameId, u32)>,
    unanswered: &mut FxHashMap<FrameId, Unanswered>,
    frame: FrameId,
    asks: Vec<Ask>,
) -> Actions<(FrameId, u32)> {
    unanswered.insert(
        frame,
        Unanswered {
            answers: vec![None; asks.len()],
            left: asks.len(),
        },
    );
    seq.on_asks((asks.into_iter().enumerate()).map(|(i, a)| ((frame, i as u32), a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_log_gets_a_lease_of_a_sixteenth_of_its_period() {
        assert_eq!(lease_for(4096, 65_532), 4095);
        assert_eq!(lease_for(4096, 1 << 20), 4096);
        assert_eq!(lease_for(4096, 3069), 191);
        assert_eq!(lease_for(4096, 3), 1);
    }

    #[test]
    fn a_replaced_sequencer_refuses_and_takes_no_epoch() {
        let mut s = LogService::new("events".into(), "127.0.0.1:1".into(), 16);
        let (frame, effects) = s.on_frame(0, vec![Ask::Tail { streams: vec![] }]);
        assert!(matches!(
            effects[..],
            [Effect::AskManager(Request::Sequencer)]
        ));
        let (second, effects) = s.on_frame(0, vec![Ask::Tail { streams: vec![] }]);
        assert!(effects.is_empty(), "one takeover at a time");
        let effects = s.on_manager(Ok(Response::Sequencer(Some("127.0.0.1:2".into()))));
        let refused: Vec<FrameId> = effects
            .iter()
            .map(|e| match e {
                Effect::Refuse(f, ErrorCode::Conflict, _) => *f,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(refused, vec![frame, second]);
        assert_eq!(s.epoch(), None);
    }

    #[test]
    fn an_empty_frame_is_answered_at_once() {
        let mut s = LogService::new("events".into(), "127.0.0.1:1".into(), 16);
        let (frame, effects) = s.on_frame(0, vec![]);
        assert!(matches!(&effects[..], [Effect::Answer(f, a)] if *f == frame && a.is_empty()));
    }
}
