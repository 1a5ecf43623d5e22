//! Stage 2 of participant recovery (Sinfonia Fig. 8 with the §4.5 optimisations) as a state
//! machine: learn each peer's all-log-tids, then ask — one batched REQUEST-ABORT per peer —
//! only about tids that some participant does not hold; a tid commits iff no participant
//! refused it. The node driver runs it over TCP; a simulator can run it unchanged.

use crate::participant::{planted, Bug, BATCH_TIDS_MAX};
use std::collections::{BTreeMap, HashMap, HashSet};
use tutti_wire::{decisions_by_node, Decision, NodeId, Outgoing, Request, Tid};

pub struct Stage2 {
    me: NodeId,
    undecided: Vec<(Tid, Vec<NodeId>)>,
    held: HashMap<NodeId, HashSet<Tid>>,
    refused: HashSet<Tid>,
    phase: Phase,
    /// Answers awaited in the current phase, per peer.
    waiting: BTreeMap<NodeId, usize>,
}

#[derive(PartialEq, Eq)]
enum Phase {
    LogTids,
    Votes,
}

impl Stage2 {
    /// Starts with the node's undecided tids; returns the LogTids queries to send: each peer
    /// is asked which of the undecided tids it participates in it holds, in batches (none if
    /// there is nothing to decide).
    pub fn start(me: NodeId, undecided: Vec<(Tid, Vec<NodeId>)>) -> (Stage2, Outgoing) {
        let mut per_peer: BTreeMap<NodeId, Vec<Tid>> = BTreeMap::new();
        for (tid, d) in &undecided {
            for &q in d.iter().filter(|&&q| q != me) {
                per_peer.entry(q).or_default().push(*tid);
            }
        }
        let mut queries = Vec::new();
        let mut waiting = BTreeMap::new();
        for (q, tids) in per_peer {
            for chunk in tids.chunks(BATCH_TIDS_MAX) {
                queries.push((
                    q,
                    Request::LogTids {
                        tids: chunk.to_vec(),
                    },
                ));
                *waiting.entry(q).or_default() += 1;
            }
        }
        let phase = if queries.is_empty() {
            Phase::Votes
        } else {
            Phase::LogTids
        };
        let stage = Stage2 {
            me,
            undecided,
            held: HashMap::new(),
            refused: HashSet::new(),
            phase,
            waiting,
        };
        (stage, queries)
    }

    /// `start`, for a mirror that was just promoted primary (`log-repl`): it resolves its
    /// undecided tids by the same rules as any restarting node, asking the same peers (a
    /// vote its old primary sent may have committed the tid everywhere else).
    pub fn after_promotion(me: NodeId, undecided: Vec<(Tid, Vec<NodeId>)>) -> (Stage2, Outgoing) {
        if planted(Bug::PromotionSkipsStage2) {
            let refused = undecided.iter().map(|(tid, _)| *tid).collect();
            let stage = Stage2 {
                me,
                undecided,
                held: HashMap::new(),
                refused,
                phase: Phase::Votes,
                waiting: BTreeMap::new(),
            };
            return (stage, Vec::new());
        }
        Stage2::start(me, undecided)
    }

    /// Peer `q` answered one of its LogTids queries. Once every query is answered, returns
    /// the REQUEST-ABORTs to send (possibly none: then `done` holds).
    pub fn on_log_tids(&mut self, q: NodeId, tids: Vec<Tid>) -> Option<Outgoing> {
        if self.phase != Phase::LogTids {
            return None;
        }
        let left = self.waiting.get_mut(&q)?;
        *left -= 1;
        if *left == 0 {
            self.waiting.remove(&q);
        }
        self.held.entry(q).or_default().extend(tids);
        if !self.waiting.is_empty() {
            return None;
        }
        self.phase = Phase::Votes;
        let mut ask: BTreeMap<NodeId, Vec<(Tid, Vec<NodeId>)>> = BTreeMap::new();
        for (tid, d) in &self.undecided {
            for &q in d.iter().filter(|&&q| q != self.me) {
                if !self.held.get(&q).is_some_and(|h| h.contains(tid)) {
                    ask.entry(q).or_default().push((*tid, d.clone()));
                }
            }
        }
        let mut requests = Vec::new();
        for (q, tids) in ask {
            for chunk in tids.chunks(BATCH_TIDS_MAX) {
                *self.waiting.entry(q).or_default() += 1;
                requests.push((
                    q,
                    Request::RequestAbort {
                        tids: chunk.to_vec(),
                    },
                ));
            }
        }
        Some(requests)
    }

    /// Peer `q` answered one of its REQUEST-ABORTs.
    pub fn on_votes(&mut self, q: NodeId, votes: &[(Tid, bool)]) {
        if self.phase != Phase::Votes {
            return;
        }
        if let Some(left) = self.waiting.get_mut(&q) {
            self.refused
                .extend(votes.iter().filter(|(_, ok)| !ok).map(|(t, _)| *t));
            *left -= 1;
            if *left == 0 {
                self.waiting.remove(&q);
            }
        }
    }

    /// Every outcome is known.
    pub fn done(&self) -> bool {
        self.phase == Phase::Votes && self.waiting.is_empty()
    }

    /// Every undecided tid with its outcome, and the DECISIONs that tell the other
    /// participants (they may still hold the tid as uncertain).
    pub fn outcomes(&self) -> (Vec<(Tid, bool)>, Outgoing) {
        let outcomes: Vec<(Tid, bool)> = self
            .undecided
            .iter()
            .map(|(t, _)| (*t, !self.refused.contains(t)))
            .collect();
        let decisions = decisions_by_node(self.undecided.iter().zip(&outcomes).flat_map(
            |((tid, d), &(_, commit))| {
                let decision = Decision::without_lsns(*tid, commit);
                d.iter()
                    .filter(|&&q| q != self.me)
                    .map(move |&q| (q, decision.clone()))
            },
        ));
        (outcomes, decisions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 3,
            seq,
        }
    }

    #[test]
    fn asks_only_about_tids_a_peer_does_not_hold() {
        let undecided = vec![(tid(1), vec![1, 2, 3]), (tid(2), vec![1, 2])];
        let (mut s, queries) = Stage2::start(1, undecided);
        assert_eq!(queries.len(), 2);
        // Each peer is asked only about the tids it takes part in: answers stay bounded.
        assert!(matches!(&queries[1], (3, Request::LogTids { tids }) if tids == &vec![tid(1)]));
        assert!(s.on_log_tids(2, vec![tid(1), tid(2)]).is_none());
        let asks = s.on_log_tids(3, vec![]).unwrap();
        assert_eq!(asks.len(), 1, "only node 3 lacks a tid");
        assert!(!s.done());
        s.on_votes(3, &[(tid(1), false)]);
        assert!(s.done());
        let (outcomes, decisions) = s.outcomes();
        assert_eq!(outcomes, vec![(tid(1), false), (tid(2), true)]);
        let decision = |seq, commit| Decision::without_lsns(tid(seq), commit);
        let (to_2, to_3) = (
            vec![decision(1, false), decision(2, true)],
            vec![decision(1, false)],
        );
        assert!(
            matches!(&decisions[..], [(2, Request::Decisions(a)), (3, Request::Decisions(b))]
                if *a == to_2 && *b == to_3),
            "one DECISIONS per peer: {decisions:?}"
        );
    }

    #[test]
    fn everything_held_everywhere_needs_no_request_abort() {
        let (mut s, _) = Stage2::start(2, vec![(tid(1), vec![1, 2])]);
        assert_eq!(s.on_log_tids(1, vec![tid(1)]).unwrap().len(), 0);
        assert!(s.done());
        assert_eq!(s.outcomes().0, vec![(tid(1), true)]);
    }
}
