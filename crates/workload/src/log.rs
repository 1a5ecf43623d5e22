//! The shared log's workload, checked alike by the simulator and `tutti chaos`: appenders put
//! uniquely tagged entries in one or two streams, readers follow one stream each, and the
//! checks compare what every client saw with what the log holds at the end.

use crate::Violation;
use std::collections::{BTreeMap, BTreeSet};

pub type StreamId = u32;

/// An acknowledged append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    pub position: u64,
    pub streams: Vec<StreamId>,
    pub payload: Vec<u8>,
}

/// An append whose outcome is unknown (its client died, or gave up): streams, payload.
pub type Unsure = (Vec<StreamId>, Vec<u8>);

/// What one reader returned from its stream, in order, having synced from `from` to `to`:
/// every entry of the stream in [from, to) should be there, and nothing else of the stream's
/// (entries past `to` may be).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub reader: String,
    pub stream: StreamId,
    pub from: u64,
    pub to: u64,
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// What a position holds at the end of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    Data {
        streams: Vec<StreamId>,
        payload: Vec<u8>,
    },
    Junk,
    Empty,
    /// Below the trim point: nothing to check.
    Trimmed,
}

/// Everything the clients of a run saw.
#[derive(Clone, Debug, Default)]
pub struct LogHistory {
    pub acked: Vec<Acked>,
    pub unknown: Vec<Unsure>,
    pub readings: Vec<Reading>,
}

impl LogHistory {
    /// No two acknowledged appends at one position, and each acknowledged append that is
    /// not trimmed is in its slot (`held`), with its streams and payload.
    pub fn check_appends(&self, held: impl Fn(u64) -> Held) -> Vec<Violation> {
        let mut violations = Vec::new();
        let mut at: BTreeSet<u64> = BTreeSet::new();
        for a in &self.acked {
            if !at.insert(a.position) {
                let why = format!("two acknowledged appends at position {}", a.position);
                violations.push(Violation::new("write-once", why));
            }
            let expected = Held::Data {
                streams: a.streams.clone(),
                payload: a.payload.clone(),
            };
            match held(a.position) {
                Held::Trimmed => {}
                h if h == expected => {}
                h => {
                    let why = format!(
                        "the append acknowledged at {} is not there: {h:?}",
                        a.position
                    );
                    violations.push(Violation::new("lost append", why));
                }
            }
        }
        violations
    }

    /// Each reading is in log order, holds each entry once, every acknowledged append to
    /// its stream in its range, and nothing that was never appended to its stream (an
    /// append of unknown outcome may or may not be there).
    pub fn check_readings(&self) -> Vec<Violation> {
        let mut violations = Vec::new();
        for r in &self.readings {
            violations.extend(self.check_reading(r));
        }
        violations
    }

    fn check_reading(&self, r: &Reading) -> Vec<Violation> {
        let mut violations = Vec::new();
        let who = format!(
            "reader {} of stream {} (synced {}..{})",
            r.reader, r.stream, r.from, r.to
        );
        let positions: Vec<u64> = r.entries.iter().map(|(p, _)| *p).collect();
        if positions.windows(2).any(|w| w[0] >= w[1]) {
            let why = format!("{who}: {positions:?} not in log order");
            violations.push(Violation::new("stream order", why));
        }
        let mut payloads = BTreeSet::new();
        for (p, payload) in &r.entries {
            if !payloads.insert(payload) {
                let why = format!("{who} read the entry at {p} twice");
                violations.push(Violation::new("stream", why));
            }
        }
        let acked: BTreeMap<u64, &Vec<u8>> = (self.acked.iter())
            .filter(|a| a.streams.contains(&r.stream))
            .map(|a| (a.position, &a.payload))
            .collect();
        let got: BTreeMap<u64, &Vec<u8>> = r.entries.iter().map(|(p, d)| (*p, d)).collect();
        for (p, payload) in acked.range(r.from..r.to) {
            if got.get(p) != Some(payload) {
                let why = format!("{who} missed the append at {p}");
                violations.push(Violation::new("stream", why));
            }
        }
        // Entries past `to` are allowed: a reader killed while it returned a sync's entries
        // never said it had synced that far.
        for (p, payload) in &got {
            let acked_here = acked.get(p) == Some(payload);
            let maybe = (self.unknown.iter()).any(|(s, m)| s.contains(&r.stream) && m == *payload);
            if !acked_here && !maybe {
                let why = format!("{who} read {p}, never appended to it there");
                violations.push(Violation::new("stream", why));
            }
        }
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history() -> LogHistory {
        LogHistory {
            acked: vec![
                Acked {
                    position: 3,
                    streams: vec![1],
                    payload: b"a".to_vec(),
                },
                Acked {
                    position: 5,
                    streams: vec![1, 2],
                    payload: b"b".to_vec(),
                },
            ],
            unknown: vec![(vec![1], b"c".to_vec())],
            readings: vec![],
        }
    }

    fn reading(from: u64, to: u64, entries: &[(u64, &[u8])]) -> Reading {
        Reading {
            reader: "r".into(),
            stream: 1,
            from,
            to,
            entries: entries.iter().map(|(p, d)| (*p, d.to_vec())).collect(),
        }
    }

    fn kinds(v: Vec<Violation>) -> Vec<&'static str> {
        v.into_iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_complete_reading_passes_and_each_fault_is_named() {
        let mut h = history();
        h.readings = vec![
            reading(0, 9, &[(3, b"a"), (4, b"c"), (5, b"b")]),
            reading(4, 9, &[(5, b"b")]),
            reading(0, 4, &[(3, b"a"), (5, b"b")]),
        ];
        assert_eq!(kinds(h.check_readings()), Vec::<&str>::new());
        h.readings = vec![reading(0, 9, &[(3, b"a")])];
        assert_eq!(kinds(h.check_readings()), ["stream"], "missed 5");
        h.readings = vec![reading(0, 9, &[(5, b"b"), (3, b"a")])];
        assert_eq!(kinds(h.check_readings()), ["stream order"]);
        h.readings = vec![reading(0, 9, &[(3, b"a"), (5, b"b"), (6, b"x")])];
        assert_eq!(kinds(h.check_readings()), ["stream"], "never appended");
        h.readings = vec![reading(0, 9, &[(3, b"a"), (5, b"b"), (7, b"b")])];
        assert_eq!(kinds(h.check_readings()), ["stream", "stream"], "twice");
    }

    #[test]
    fn appends_must_be_in_their_slots_unless_trimmed() {
        let h = history();
        let held = |p: u64| match p {
            3 => Held::Trimmed,
            _ => Held::Data {
                streams: vec![1, 2],
                payload: b"b".to_vec(),
            },
        };
        assert!(h.check_appends(held).is_empty());
        assert_eq!(kinds(h.check_appends(|_| Held::Junk)), ["lost append"; 2]);
        let mut twice = history();
        twice.acked[1].position = 3;
        assert_eq!(
            kinds(twice.check_appends(|_| Held::Trimmed)),
            ["write-once"]
        );
    }
}
