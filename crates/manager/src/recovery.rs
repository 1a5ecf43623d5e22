//! The recovery coordinator of Sinfonia Fig. 7 as a state machine: it asks every
//! participant of a batch of tids to vote (one batched REQUEST-ABORT per node) and, once
//! every node answered, decides each tid (commit iff every participant holds a commit vote).
//! The manager drives it over TCP; a simulator can drive it over a simulated network.

use crate::state::RecoveryBatch;
use std::collections::{BTreeSet, HashMap};
use tutti_wire::{decisions_by_node, Decision, NodeId, Outgoing, Request, Tid};

pub struct Recovery {
    batch: RecoveryBatch,
    votes: HashMap<Tid, bool>,
    waiting: BTreeSet<NodeId>,
}

impl Recovery {
    /// Phase 1 (Fig. 7 lines 32–34): the REQUEST-ABORT to send to each node.
    pub fn start(batch: RecoveryBatch) -> (Recovery, Outgoing) {
        let requests = batch
            .by_node
            .iter()
            .map(|(&q, tids)| (q, Request::RequestAbort { tids: tids.clone() }))
            .collect();
        let votes = batch.tids.iter().map(|(t, _)| (*t, true)).collect();
        let waiting = batch.by_node.keys().copied().collect();
        (
            Recovery {
                batch,
                votes,
                waiting,
            },
            requests,
        )
    }

    /// Node `q` answered. When it was the last one, returns phase 2: the DECISION for every
    /// participant of every tid (Fig. 7 lines 35–36).
    pub fn on_votes(&mut self, q: NodeId, votes: &[(Tid, bool)]) -> Option<Outgoing> {
        if !self.waiting.remove(&q) {
            return None;
        }
        for (tid, ok) in votes {
            if let Some(v) = self.votes.get_mut(tid) {
                *v &= ok;
            }
        }
        if !self.waiting.is_empty() {
            return None;
        }
        let decisions =
            decisions_by_node(self.batch.tids.iter().flat_map(|(tid, participants)| {
                let decision = Decision::without_lsns(*tid, self.votes[tid]);
                participants.iter().map(move |&q| (q, decision.clone()))
            }));
        Some(decisions)
    }

    /// The outcome decided for each tid, once `on_votes` returned the decisions.
    pub fn outcomes(&self) -> impl Iterator<Item = (Tid, bool)> + '_ {
        self.batch.tids.iter().map(|(t, _)| (*t, self.votes[t]))
    }

    pub fn batch(&self) -> &RecoveryBatch {
        &self.batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 2,
            seq,
        }
    }

    #[test]
    fn commits_only_what_every_participant_voted_for() {
        let tids = vec![(tid(1), vec![1, 2]), (tid(2), vec![1, 2])];
        let mut by_node = BTreeMap::new();
        by_node.insert(1, tids.clone());
        by_node.insert(2, tids.clone());
        let (mut r, requests) = Recovery::start(RecoveryBatch { tids, by_node });
        assert_eq!(requests.len(), 2, "one batched REQUEST-ABORT per node");
        assert!(r.on_votes(1, &[(tid(1), true), (tid(2), true)]).is_none());
        assert!(
            r.on_votes(1, &[]).is_none(),
            "a duplicate answer changes nothing"
        );
        let decisions = r.on_votes(2, &[(tid(1), true), (tid(2), false)]).unwrap();
        let both = vec![
            Decision::without_lsns(tid(1), true),
            Decision::without_lsns(tid(2), false),
        ];
        assert!(
            matches!(&decisions[..], [(1, Request::Decisions(a)), (2, Request::Decisions(b))]
                if *a == both && *b == both),
            "one DECISIONS per node: {decisions:?}"
        );
        assert_eq!(
            r.outcomes().collect::<Vec<_>>(),
            vec![(tid(1), true), (tid(2), false)]
        );
    }
}
