//! Stage 2 of participant recovery (Sinfonia Fig. 8 with the §4.5 optimisations) as a state
//! machine: learn each peer's all-log-tids, then ask that peer (batched REQUEST-ABORTs)
//! only about the tids it does not hold; a tid commits iff no participant refused it. Each
//! tid is decided as soon as its own participants have answered, so that a peer that is
//! down holds back only the tids it takes part in. The node driver runs it over TCP; a
//! simulator can run it unchanged.

use crate::participant::{planted, Bug, BATCH_TIDS_MAX};
use std::collections::{BTreeMap, HashMap, HashSet};
use tutti_wire::{decisions_by_node, Decision, NodeId, Outgoing, Request, Tid};

pub struct Stage2 {
    me: NodeId,
    undecided: Vec<(Tid, Vec<NodeId>)>,
    /// Per tid not handed out by `decided` yet, the peers whose answer about it is still
    /// awaited.
    awaited: HashMap<Tid, HashSet<NodeId>>,
    /// Per peer, the tids it said it holds (until all its LogTids answers are in).
    held: HashMap<NodeId, HashSet<Tid>>,
    /// LogTids answers still awaited, per peer.
    log_tids_left: BTreeMap<NodeId, usize>,
    refused: HashSet<Tid>,
}

impl Stage2 {
    /// Starts with the node's undecided tids; returns the LogTids queries to send: each peer
    /// is asked which of the undecided tids it participates in it holds, in batches (none if
    /// there is nothing to decide).
    pub fn start(me: NodeId, undecided: Vec<(Tid, Vec<NodeId>)>) -> (Stage2, Outgoing) {
        let mut asked: BTreeMap<NodeId, Vec<Tid>> = BTreeMap::new();
        let mut awaited = HashMap::new();
        for (tid, d) in &undecided {
            let peers: HashSet<NodeId> = d.iter().copied().filter(|&q| q != me).collect();
            for &q in &peers {
                asked.entry(q).or_default().push(*tid);
            }
            awaited.insert(*tid, peers);
        }
        let mut queries = Vec::new();
        let mut log_tids_left = BTreeMap::new();
        for (&q, tids) in &asked {
            for chunk in tids.chunks(BATCH_TIDS_MAX) {
                queries.push((
                    q,
                    Request::LogTids {
                        tids: chunk.to_vec(),
                    },
                ));
                *log_tids_left.entry(q).or_default() += 1;
            }
        }
        let stage = Stage2 {
            me,
            undecided,
            awaited,
            held: HashMap::new(),
            log_tids_left,
            refused: HashSet::new(),
        };
        (stage, queries)
    }

    /// `start`, for a mirror that was just promoted primary (`log-repl`): it resolves its
    /// undecided tids by the same rules as any restarting node, asking the same peers (a
    /// vote its old primary sent may have committed the tid everywhere else).
    pub fn after_promotion(me: NodeId, undecided: Vec<(Tid, Vec<NodeId>)>) -> (Stage2, Outgoing) {
        if planted(Bug::PromotionSkipsStage2) {
            let refused = undecided.iter().map(|(tid, _)| *tid).collect();
            let awaited = undecided
                .iter()
                .map(|(t, _)| (*t, HashSet::new()))
                .collect();
            let stage = Stage2 {
                me,
                undecided,
                awaited,
                held: HashMap::new(),
                log_tids_left: BTreeMap::new(),
                refused,
            };
            return (stage, Vec::new());
        }
        Stage2::start(me, undecided)
    }

    /// Peer `q` answered one of its LogTids queries with the tids it holds. Once all of
    /// `q`'s are answered, returns the REQUEST-ABORTs to send `q` about the tids it asked
    /// and does not hold (none if it holds them all).
    pub fn on_log_tids(&mut self, q: NodeId, tids: Vec<Tid>) -> Outgoing {
        let Some(left) = self.log_tids_left.get_mut(&q) else {
            return Vec::new();
        };
        *left -= 1;
        self.held.entry(q).or_default().extend(tids);
        if *left > 0 {
            return Vec::new();
        }
        self.log_tids_left.remove(&q);
        let held = self.held.remove(&q).unwrap_or_default();
        let mut missing = Vec::new();
        for (tid, d) in self.undecided.iter().filter(|(_, d)| d.contains(&q)) {
            if held.contains(tid) || planted(Bug::DecidedBeforeAnswered) {
                if let Some(peers) = self.awaited.get_mut(tid) {
                    peers.remove(&q);
                }
            }
            if !held.contains(tid) {
                missing.push((*tid, d.clone()));
            }
        }
        missing
            .chunks(BATCH_TIDS_MAX)
            .map(|chunk| {
                (
                    q,
                    Request::RequestAbort {
                        tids: chunk.to_vec(),
                    },
                )
            })
            .collect()
    }

    /// Peer `q` answered one of its REQUEST-ABORTs.
    pub fn on_votes(&mut self, q: NodeId, votes: &[(Tid, bool)]) {
        for &(tid, ok) in votes {
            let Some(peers) = self.awaited.get_mut(&tid) else {
                continue;
            };
            if peers.remove(&q) && !ok {
                self.refused.insert(tid);
            }
        }
    }

    /// How many tids it decides.
    pub fn tids(&self) -> usize {
        self.undecided.len()
    }

    /// Every outcome is known.
    pub fn done(&self) -> bool {
        self.awaited.values().all(HashSet::is_empty)
    }

    /// The tids decided since the last call, each with its outcome, and the DECISIONs that
    /// tell their other participants (they may still hold the tid as uncertain).
    pub fn decided(&mut self) -> (Vec<(Tid, bool)>, Outgoing) {
        let mut outcomes = Vec::new();
        let mut told = Vec::new();
        for (tid, d) in &self.undecided {
            if !self.awaited.get(tid).is_some_and(HashSet::is_empty) {
                continue;
            }
            self.awaited.remove(tid);
            let commit = !self.refused.contains(tid);
            outcomes.push((*tid, commit));
            let decision = Decision::without_lsns(*tid, commit);
            told.extend((d.iter().filter(|&&q| q != self.me)).map(|&q| (q, decision.clone())));
        }
        (outcomes, decisions_by_node(told))
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
        assert!(s.on_log_tids(2, vec![tid(1), tid(2)]).is_empty());
        // Tid 2's participants have all answered: it is decided before node 3 answers.
        let (outcomes, decisions) = s.decided();
        assert_eq!(outcomes, vec![(tid(2), true)]);
        assert!(
            matches!(&decisions[..], [(2, Request::Decisions(d))]
                if *d == vec![Decision::without_lsns(tid(2), true)]),
            "{decisions:?}"
        );
        let asks = s.on_log_tids(3, vec![]);
        assert_eq!(asks.len(), 1, "only node 3 lacks a tid");
        assert!(!s.done());
        assert!(s.decided().0.is_empty());
        s.on_votes(3, &[(tid(1), false)]);
        assert!(s.done());
        let (outcomes, decisions) = s.decided();
        assert_eq!(outcomes, vec![(tid(1), false)]);
        let to_both = vec![Decision::without_lsns(tid(1), false)];
        assert!(
            matches!(&decisions[..], [(2, Request::Decisions(a)), (3, Request::Decisions(b))]
                if *a == to_both && *b == to_both),
            "one DECISIONS per peer: {decisions:?}"
        );
        assert!(s.decided().0.is_empty(), "each outcome is handed out once");
    }

    /// A peer that never answers holds back only the tids it takes part in.
    #[test]
    fn a_silent_peer_holds_back_only_its_own_tids() {
        let undecided = vec![
            (tid(1), vec![1, 2]),
            (tid(2), vec![1, 3]),
            (tid(3), vec![1, 2, 3]),
        ];
        let (mut s, _) = Stage2::start(1, undecided);
        let asks = s.on_log_tids(2, vec![tid(3)]);
        assert!(
            matches!(&asks[..], [(2, Request::RequestAbort { tids })]
                if *tids == vec![(tid(1), vec![1, 2])]),
            "{asks:?}"
        );
        s.on_votes(2, &[(tid(1), true)]);
        assert_eq!(s.decided().0, vec![(tid(1), true)]);
        assert!(!s.done(), "node 3 has not answered");
    }

    #[test]
    fn everything_held_everywhere_needs_no_request_abort() {
        let (mut s, _) = Stage2::start(2, vec![(tid(1), vec![1, 2])]);
        assert_eq!(s.on_log_tids(1, vec![tid(1)]).len(), 0);
        assert!(s.done());
        assert_eq!(s.decided().0, vec![(tid(1), true)]);
    }
}
