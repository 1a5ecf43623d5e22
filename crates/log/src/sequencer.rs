//! The sequencer's logic (CORFU's networked counter, with Tango §5's streams): it hands out
//! the next position for an entry and, for each of the entry's streams, the stream's last K
//! positions (the backpointers the entry will carry). Sans-I/O: a driver feeds it requests
//! and carries out the reservations it asks for.
//!
//! A sequencer serves one epoch of one log. It never hands out a position at or above the
//! reservation durable on the log's memory nodes (`word::RESERVED_TO`), so that a successor
//! that sealed the log knows where its predecessor may have stopped without asking it. It
//! reserves ahead, half a lease before it runs out, so that requests rarely wait. Nor does
//! it hand out a position whose slot still holds an untrimmed entry (one period back): such
//! a position could never be written nor filled, and a reader meeting it would wait for the
//! trim forever; the request is answered `Full`, after a reservation re-read the trim point.

use crate::entry::{StreamId, STREAMS_PER_ENTRY_MAX};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Positions one reservation covers by default: a reservation every 2,048 positions, and a
/// slow check that reads at most 4,096 slot headers.
pub const LEASE_DEFAULT: u64 = 4096;

pub use tutti_wire::{Answer, Ask};

/// A reservation to make durable on every memory node of the log, comparing the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub epoch: u64,
    /// Every position below this has been handed out.
    pub from: u64,
    /// No position at or above this will be handed out until the next reservation.
    pub to: u64,
}

/// What the driver does after an input: send the answers, then make the reservation
/// durable (at most one is in flight) and report how it went.
#[derive(Debug)]
pub struct Actions<T> {
    pub answers: Vec<(T, Answer)>,
    pub reserve: Option<Reservation>,
}

impl<T> Default for Actions<T> {
    fn default() -> Self {
        Actions {
            answers: Vec::new(),
            reserve: None,
        }
    }
}

#[derive(Debug)]
pub struct Sequencer<T> {
    epoch: u64,
    next: u64,
    /// Durable reservation: positions below it may be handed out.
    reserved_to: u64,
    /// A reservation in flight, up to this.
    reserving: Option<u64>,
    lease: u64,
    k: usize,
    /// Each stream's last positions, newest first (at most `k`).
    streams: FxHashMap<StreamId, VecDeque<u64>>,
    /// Requests for positions waiting for a reservation, in arrival order.
    waiting: VecDeque<(T, Vec<StreamId>)>,
    sealed: bool,
    /// The log's trim point as last read, and its period (positions per lap of the slots):
    /// positions from `trim + period` on have no free slot yet.
    trim: u64,
    period: u64,
}

impl<T> Sequencer<T> {
    /// The sequencer of `epoch` for a log of `period` positions per lap, after its driver
    /// sealed the log at `epoch` and found where the epoch starts (`tail`) and the trim
    /// point. `history` gives the streams of the entries below the tail, newest first (the
    /// backward scan; it may stop once every stream has `k`). Nothing is handed out before
    /// the first reservation (returned) is durable.
    pub fn start(
        epoch: u64,
        (tail, trim, period): (u64, u64, u64),
        k: u8,
        lease: u64,
        history: impl IntoIterator<Item = (u64, Vec<StreamId>)>,
    ) -> (Sequencer<T>, Reservation) {
        let k = usize::from(k);
        let mut streams: FxHashMap<StreamId, VecDeque<u64>> = FxHashMap::default();
        for (position, ids) in history {
            debug_assert!(position < tail);
            for id in ids {
                let last = streams.entry(id).or_default();
                if last.len() < k {
                    last.push_back(position);
                }
            }
        }
        let mut s = Sequencer {
            epoch,
            next: tail,
            reserved_to: tail,
            reserving: None,
            lease: lease.max(1),
            k,
            streams,
            waiting: VecDeque::new(),
            sealed: false,
            trim,
            period,
        };
        let r = s.reserve().expect("nothing is in flight yet");
        (s, r)
    }

    /// A batch of requests, answered in order where they can be now; requests for positions
    /// beyond the durable reservation wait for the next.
    pub fn on_asks(&mut self, asks: impl IntoIterator<Item = (T, Ask)>) -> Actions<T> {
        let mut acts = Actions::default();
        for (token, ask) in asks {
            let streams = match &ask {
                Ask::Next { streams } | Ask::Tail { streams } => streams,
            };
            if streams.len() > STREAMS_PER_ENTRY_MAX {
                acts.answers
                    .push((token, Answer::TooManyStreams(streams.len() as u32)));
                continue;
            }
            if self.sealed {
                acts.answers.push((token, self.sealed_answer()));
                continue;
            }
            match ask {
                Ask::Tail { streams } => {
                    let last = streams.iter().map(|s| self.last(*s)).collect();
                    acts.answers.push((
                        token,
                        Answer::Tail {
                            tail: self.next,
                            epoch: self.epoch,
                            last,
                        },
                    ));
                }
                Ask::Next { streams } => {
                    if self.waiting.is_empty() && self.grantable() {
                        let answer = self.grant(&streams);
                        acts.answers.push((token, answer));
                    } else {
                        self.waiting.push_back((token, streams));
                    }
                }
            }
        }
        acts.reserve = self.reserve_if_low();
        acts
    }

    /// The reservation up to `to` is durable, and the log's trim point was `trim`: grant
    /// what waited for it; what still finds the log full is told so.
    pub fn on_reserved(&mut self, to: u64, trim: u64) -> Actions<T> {
        debug_assert_eq!(self.reserving, Some(to));
        self.reserving = None;
        self.reserved_to = self.reserved_to.max(to);
        self.trim = self.trim.max(trim);
        let mut acts = Actions::default();
        while self.grantable() {
            let Some((token, streams)) = self.waiting.pop_front() else {
                break;
            };
            let answer = self.grant(&streams);
            acts.answers.push((token, answer));
        }
        if self.next >= self.room() {
            let full = Answer::Full {
                position: self.next,
                trim: self.trim,
            };
            (acts.answers).extend(
                self.waiting
                    .drain(..)
                    .map(|(token, _)| (token, full.clone())),
            );
        }
        acts.reserve = self.reserve_if_low();
        acts
    }

    /// The first position with no free slot: its slot holds an entry at or above the trim
    /// point.
    fn room(&self) -> u64 {
        self.trim.saturating_add(self.period)
    }

    fn grantable(&self) -> bool {
        self.next < self.reserved_to && self.next < self.room()
    }

    /// The reservation was refused: the log's epoch moved past ours. Everything waiting,
    /// and everything asked from now on, is told so; positions granted already will be
    /// refused by the memory nodes.
    pub fn on_sealed(&mut self) -> Actions<T> {
        self.sealed = true;
        self.reserving = None;
        let sealed = self.sealed_answer();
        Actions {
            answers: self
                .waiting
                .drain(..)
                .map(|(token, _)| (token, sealed.clone()))
                .collect(),
            reserve: None,
        }
    }

    fn sealed_answer(&self) -> Answer {
        Answer::Sealed { epoch: self.epoch }
    }

    fn last(&self, stream: StreamId) -> Vec<u64> {
        self.streams
            .get(&stream)
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default()
    }

    fn grant(&mut self, streams: &[StreamId]) -> Answer {
        let position = self.next;
        self.next += 1;
        let k = self.k;
        let backpointers = streams
            .iter()
            .map(|s| {
                let last = self.streams.entry(*s).or_default();
                let before: Vec<u64> = last.iter().copied().collect();
                last.push_front(position);
                last.truncate(k);
                before
            })
            .collect();
        Answer::Granted {
            position,
            epoch: self.epoch,
            backpointers,
        }
    }

    /// A new reservation once less than half a lease is left (or requests wait).
    fn reserve_if_low(&mut self) -> Option<Reservation> {
        let low = self.reserved_to.saturating_sub(self.next) < self.lease / 2;
        if (low || !self.waiting.is_empty()) && !self.sealed {
            self.reserve()
        } else {
            None
        }
    }

    fn reserve(&mut self) -> Option<Reservation> {
        if self.reserving.is_some() {
            return None;
        }
        let to = self.next + self.waiting.len() as u64 + self.lease;
        self.reserving = Some(to);
        Some(Reservation {
            epoch: self.epoch,
            from: self.next,
            to,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(streams: &[StreamId]) -> Ask {
        Ask::Next {
            streams: streams.to_vec(),
        }
    }

    fn granted(a: &Answer) -> (u64, Vec<Vec<u64>>) {
        match a {
            Answer::Granted {
                position,
                backpointers,
                ..
            } => (*position, backpointers.clone()),
            other => panic!("not a grant: {other:?}"),
        }
    }

    #[test]
    fn nothing_is_granted_before_the_first_reservation_is_durable() {
        let (mut s, r) = Sequencer::start(2, (10, 0, u64::MAX), 4, 8, []);
        assert_eq!(
            r,
            Reservation {
                epoch: 2,
                from: 10,
                to: 18
            }
        );
        let acts = s.on_asks([(1, next(&[])), (2, next(&[]))]);
        assert!(acts.answers.is_empty());
        assert!(acts.reserve.is_none(), "one reservation at a time");
        let acts = s.on_reserved(18, 0);
        let positions: Vec<_> = acts
            .answers
            .iter()
            .map(|(t, a)| (*t, granted(a).0))
            .collect();
        assert_eq!(positions, vec![(1, 10), (2, 11)]);
        assert!(acts.reserve.is_none(), "6 of 8 left");
    }

    #[test]
    fn backpointers_are_each_streams_last_k_newest_first() {
        let (mut s, r) = Sequencer::start(1, (0, 0, u64::MAX), 2, 100, []);
        s.on_reserved(r.to, 0);
        let mut got = Vec::new();
        for (i, streams) in [vec![7], vec![8], vec![7, 8], vec![7]]
            .into_iter()
            .enumerate()
        {
            let acts = s.on_asks([(i, next(&streams))]);
            got.push(granted(&acts.answers[0].1));
        }
        assert_eq!(
            got,
            vec![
                (0, vec![vec![]]),
                (1, vec![vec![]]),
                (2, vec![vec![0], vec![1]]),
                (3, vec![vec![2, 0]]),
            ]
        );
        let acts = s.on_asks([(
            9,
            Ask::Tail {
                streams: vec![7, 8, 5],
            },
        )]);
        assert_eq!(
            acts.answers[0].1,
            Answer::Tail {
                tail: 4,
                epoch: 1,
                last: vec![vec![3, 2], vec![2, 1], vec![]]
            }
        );
    }

    #[test]
    fn a_successor_rebuilds_streams_from_the_backward_scan() {
        let history = [(9, vec![1]), (7, vec![1, 2]), (5, vec![1]), (2, vec![1])];
        let (mut s, r) = Sequencer::start(3, (10, 0, u64::MAX), 2, 100, history);
        s.on_reserved(r.to, 0);
        let acts = s.on_asks([(0, next(&[1, 2]))]);
        assert_eq!(granted(&acts.answers[0].1), (10, vec![vec![9, 7], vec![7]]));
    }

    #[test]
    fn it_reserves_ahead_and_never_grants_past_the_reservation() {
        let (mut s, r) = Sequencer::start(1, (0, 0, u64::MAX), 4, 4, []);
        let mut durable = r.to;
        s.on_reserved(durable, 0);
        let mut in_flight = None;
        let mut granted_positions = Vec::new();
        for i in 0..40u64 {
            let acts = s.on_asks([(i, next(&[]))]);
            for (_, a) in &acts.answers {
                let (p, _) = granted(a);
                assert!(p < durable, "granted {p} beyond the reservation {durable}");
                granted_positions.push(p);
            }
            if let Some(r) = acts.reserve {
                assert!(in_flight.is_none());
                in_flight = Some(r.to);
            }
            if i % 3 == 2 {
                if let Some(to) = in_flight.take() {
                    durable = to;
                    let acts = s.on_reserved(to, 0);
                    for (_, a) in &acts.answers {
                        granted_positions.push(granted(a).0);
                    }
                    in_flight = acts.reserve.map(|r| r.to);
                }
            }
        }
        let expected: Vec<u64> = (0..granted_positions.len() as u64).collect();
        assert_eq!(granted_positions, expected, "in order, none twice");
    }

    #[test]
    fn a_full_log_hands_out_nothing_until_a_reservation_reads_a_later_trim() {
        // 10 positions per lap, trimmed below 3: position 12's slot held 2, trimmed; 13's
        // holds 3.
        let (mut s, r) = Sequencer::start(1, (11, 3, 10), 4, 100, []);
        s.on_reserved(r.to, 3);
        let acts = s.on_asks([(1, next(&[])), (2, next(&[])), (3, next(&[]))]);
        let positions: Vec<u64> = acts.answers.iter().map(|(_, a)| granted(a).0).collect();
        assert_eq!(positions, [11, 12], "13 has no free slot");
        let r = acts.reserve.expect("a reservation re-reads the trim point");
        let acts = s.on_reserved(r.to, 3);
        assert_eq!(
            acts.answers,
            vec![(
                3,
                Answer::Full {
                    position: 13,
                    trim: 3
                }
            )]
        );
        let acts = s.on_asks([(4, next(&[]))]);
        assert!(acts.answers.is_empty());
        let r = acts.reserve.expect("another look");
        let acts = s.on_reserved(r.to, 5);
        assert_eq!(granted(&acts.answers[0].1).0, 13, "trimmed below 5");
    }

    #[test]
    fn a_sealed_sequencer_answers_sealed() {
        let (mut s, _) = Sequencer::start(4, (0, 0, u64::MAX), 4, 4, []);
        s.on_asks([(1, next(&[]))]);
        let acts = s.on_sealed();
        assert_eq!(acts.answers, vec![(1, Answer::Sealed { epoch: 4 })]);
        let acts = s.on_asks([(2, next(&[])), (3, Ask::Tail { streams: vec![] })]);
        assert_eq!(acts.answers.len(), 2);
        assert!(acts.reserve.is_none());
        let many: Vec<StreamId> = (0..17).collect();
        let acts = s.on_asks([(4, next(&many))]);
        assert_eq!(acts.answers, vec![(4, Answer::TooManyStreams(17))]);
    }
}
