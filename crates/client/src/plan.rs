//! The coordinator's decision rules as pure functions (Sinfonia Fig. 4 lines 1–10): split
//! items by memory node, tally the participants' replies into a decision, and assemble the
//! outcome. `Coordinator` (in `coordinator`) sequences them; nothing else calls them.

use crate::coordinator::{planted, Bug};
use crate::{ExecError, Minitx, Outcome};
use std::borrow::Cow;
use std::collections::BTreeMap;
use tutti_wire::{
    ErrorCode, ExecPrepare, Item, NodeId, Outgoing, Request, Response, Tid, Vote, VoteReply,
};

/// Items grouped by memory node (`π_q` in Fig. 4), as positions in the minitransaction.
pub(crate) struct Plan<'a> {
    tx: Cow<'a, Minitx>,
    nodes: Vec<NodeId>,
    groups: Vec<Vec<usize>>,
    read_only: bool,
}

pub(crate) fn split(tx: Cow<'_, Minitx>) -> Plan<'_> {
    let mut by_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
    for (i, (node, _)) in tx.items.iter().enumerate() {
        by_node.entry(*node).or_default().push(i);
    }
    let (nodes, groups) = by_node.into_iter().unzip();
    let read_only = !tx.items.iter().any(|(_, item)| item.writes());
    Plan {
        tx,
        nodes,
        groups,
        read_only,
    }
}

impl Plan<'_> {
    /// Participants `D`, sorted.
    pub(crate) fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// No item writes: nothing is logged and a retry after a lost reply is harmless.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    fn item(&self, position: usize) -> &Item {
        &self.tx.items[position].1
    }

    /// The EXEC&PREPARE of the items at `positions`.
    fn exec_prepare(
        &self,
        tid: Tid,
        positions: &[usize],
        executed: u32,
        lock_wait_ms: u32,
    ) -> ExecPrepare {
        ExecPrepare {
            tid,
            participants: self.nodes.clone(),
            class: self.tx.class_name().to_string(),
            read_only: self.read_only,
            items: positions.iter().map(|&i| self.item(i).clone()).collect(),
            executed,
            lock_wait_ms,
        }
    }

    /// Each node's EXEC&PREPARE; a single node's may wait `lock_wait_ms` for busy locks.
    pub(crate) fn requests(&self, tid: Tid, lock_wait_ms: u32) -> Vec<(NodeId, Request)> {
        let lock_wait_ms = if self.nodes.len() == 1 {
            lock_wait_ms
        } else {
            0
        };
        self.nodes
            .iter()
            .zip(&self.groups)
            .map(|(&node, group)| {
                let ep = self.exec_prepare(tid, group, 0, lock_wait_ms);
                (node, Request::ExecPrepare(ep))
            })
            .collect()
    }

    /// The requests of System B in Sinfonia Fig. 17: each node's items executed ahead of
    /// the commit protocol, in one request per node (`per_item`: one per item in item
    /// order, System A), each with the positions of its items in the minitransaction.
    pub(crate) fn execute_ahead_requests(
        &self,
        tid: Tid,
        per_item: bool,
    ) -> Vec<(NodeId, Request, Vec<usize>)> {
        let mut chunks: Vec<(NodeId, Vec<usize>)> = if per_item {
            (self.nodes.iter().zip(&self.groups))
                .flat_map(|(&node, group)| group.iter().map(move |&i| (node, vec![i])))
                .collect()
        } else {
            self.nodes
                .iter()
                .copied()
                .zip(self.groups.iter().cloned())
                .collect()
        };
        chunks.sort_by_key(|(_, positions)| positions[0]);
        chunks
            .into_iter()
            .map(|(node, positions)| {
                let ep = self.exec_prepare(tid, &positions, 0, 0);
                (node, Request::ExecuteAhead(ep), positions)
            })
            .collect()
    }

    /// EXEC&PREPAREs after `execute_ahead_requests`: no items, only how many were executed.
    pub(crate) fn requests_after_execute_ahead(&self, tid: Tid) -> Vec<(NodeId, Request)> {
        self.nodes
            .iter()
            .zip(&self.groups)
            .map(|(&node, group)| {
                let ep = self.exec_prepare(tid, &[], group.len() as u32, 0);
                (node, Request::ExecPrepare(ep))
            })
            .collect()
    }

    /// Reads in item order and failed compares as positions among all items.
    pub(crate) fn outcome(
        &self,
        tid: Tid,
        replies: &[NodeReply],
        committed: bool,
    ) -> Result<Result<Outcome, String>, ExecError> {
        let mut reads: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut failed = Vec::new();
        for ((node, group), reply) in self.nodes.iter().zip(&self.groups).zip(replies) {
            let positions = group
                .iter()
                .copied()
                .filter(|&i| matches!(self.item(i), Item::Read { .. }));
            match reply {
                NodeReply::Vote(v) => {
                    reads.extend(positions.zip(v.reads.iter().cloned()));
                    failed.extend(
                        v.failed_compares
                            .iter()
                            .filter_map(|&k| group.get(k as usize).copied()),
                    );
                }
                _ if positions.clone().next().is_none() => {}
                _ if committed => return Err(ExecError::ReadsLost { tid, node: *node }),
                _ => return Ok(Err(format!("node {node}'s reply was lost"))),
            }
        }
        reads.sort_by_key(|(i, _)| *i);
        failed.sort_unstable();
        Ok(Ok(Outcome {
            committed,
            reads: reads.into_iter().map(|(_, r)| r).collect(),
            failed_compares: failed,
        }))
    }
}

/// With a commit: every participant's Prepare lsn, in participant order, for the decision
/// to carry. Empty unless every participant logged its vote (`ram` nodes log nothing) and
/// its reply arrived; the participants then report the tid for GC on its own.
pub(crate) fn commit_lsns(replies: &[NodeReply]) -> Vec<u64> {
    replies
        .iter()
        .map(|reply| match reply {
            NodeReply::Vote(v) if v.lsn != 0 => Some(v.lsn),
            _ => None,
        })
        .collect::<Option<Vec<u64>>>()
        .unwrap_or_default()
}

/// What came back from one participant for EXEC&PREPARE.
#[derive(Debug, Clone)]
pub enum NodeReply {
    Vote(VoteReply),
    /// The node answered with an error: it did not vote.
    Refused(ErrorCode, String),
    /// The request was never delivered: no vote.
    Unreachable(String),
    /// The request may have been delivered and the reply was lost: vote unknown.
    Lost(String),
    Other(Response),
}

impl NodeReply {
    pub fn from_response(resp: Response) -> NodeReply {
        match resp {
            Response::Vote(v) => NodeReply::Vote(v),
            Response::Error { code, message } => NodeReply::Refused(code, message),
            other => NodeReply::Other(other),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tally {
    /// Every participant voted COMMIT-OK: the minitransaction is committed.
    Commit,
    /// Some compare failed and nothing calls for a retry: report it, do not retry.
    AbortCompare,
    /// Aborted for a transient reason (busy lock, forced abort, stale epoch, node down).
    Retry(String),
    /// A participant refused the request itself (bad address, say): abort, report.
    Rejected { node: NodeId, message: String },
    /// No participant voted abort, but one vote is unknown (`why`): the outcome is not ours
    /// to pick.
    Unknown { node: NodeId, why: String },
}

/// The decision rule of Fig. 4 lines 7–8, refined for why an attempt aborted.
pub(crate) fn tally(nodes: &[NodeId], replies: &[NodeReply]) -> Tally {
    let mut retry: Option<String> = None;
    let mut compare_failed = false;
    let mut lost = None;
    for (&node, reply) in nodes.iter().zip(replies) {
        match reply {
            NodeReply::Vote(v) => match v.vote {
                Vote::CommitOk => {}
                Vote::AbortCompare => compare_failed = true,
                Vote::AbortLock => retry = retry.or(Some("a lock was busy".into())),
                Vote::AbortForced => retry = retry.or(Some("forced abort by recovery".into())),
                Vote::AbortEpoch => retry = retry.or(Some("stale epoch".into())),
            },
            NodeReply::Refused(ErrorCode::NotReady, m) | NodeReply::Unreachable(m) => {
                retry = retry.or(Some(m.clone()))
            }
            NodeReply::Refused(_, m) => {
                return Tally::Rejected {
                    node,
                    message: m.clone(),
                }
            }
            NodeReply::Lost(_) if planted(Bug::LostVoteCountsAsCommit) => {}
            NodeReply::Lost(why) => lost = lost.or(Some((node, why))),
            NodeReply::Other(_) => {
                return Tally::Rejected {
                    node,
                    message: "unexpected reply".into(),
                }
            }
        }
    }
    match (retry, compare_failed, lost) {
        (Some(reason), _, _) => Tally::Retry(reason),
        (None, true, _) => Tally::AbortCompare,
        (None, false, Some((node, why))) => Tally::Unknown {
            node,
            why: why.clone(),
        },
        (None, false, None) => Tally::Commit,
    }
}

/// The replies to `execute_ahead_requests` (by node, in `nodes` order): `None` if every
/// item executed and the commit protocol may start, or the tally to abort with. Nothing is
/// logged ahead, so a lost reply is only a reason to retry.
pub(crate) fn tally_execute_ahead(nodes: &[NodeId], replies: &[NodeReply]) -> Option<Tally> {
    match tally(nodes, replies) {
        Tally::Commit => None,
        Tally::Unknown { node, why } => {
            Some(Tally::Retry(format!("node {node}'s reply was lost: {why}")))
        }
        other => Some(other),
    }
}

/// A vote was lost with its connection and no participant voted abort: the outcome is
/// already fixed by the votes on record, so ask each silent node with REQUEST-ABORT (which
/// forces an abort if it never voted). A ram node's one-phase commit leaves no record to
/// ask about, so that case is `Err(Tally::Unknown)` at once.
pub(crate) fn lost_vote_queries(
    plan: &Plan<'_>,
    tid: Tid,
    replies: &[NodeReply],
    durable: impl Fn(NodeId) -> bool,
) -> Result<Outgoing, Tally> {
    if let [node] = plan.nodes() {
        if !plan.read_only() && !durable(*node) {
            return Err(Tally::Unknown {
                node: *node,
                why: "its reply was lost and a ram node keeps no record of its vote".into(),
            });
        }
    }
    let participants = plan.nodes().to_vec();
    Ok(plan
        .nodes()
        .iter()
        .zip(replies)
        .filter(|(_, reply)| matches!(reply, NodeReply::Lost(_)))
        .map(|(&node, _)| {
            (
                node,
                Request::RequestAbort {
                    tids: vec![(tid, participants.clone())],
                },
            )
        })
        .collect())
}

/// Phase 2 of a committed read-only minitransaction over several nodes: RELEASEs whose
/// answers `released` must confirm. (One that writes sends one-way decisions instead, and a
/// single participant needs nothing.)
pub(crate) fn releases(plan: &Plan<'_>, tid: Tid) -> Outgoing {
    plan.nodes()
        .iter()
        .map(|&n| (n, Request::Release { tid }))
        .collect()
}

/// A read-only minitransaction over several nodes is serializable only if every participant
/// still held its read locks when the last vote was cast; a participant that crashed or was
/// decided by recovery meanwhile did not, and the reads must be retried.
pub(crate) fn released(answers: &[Option<Response>]) -> Tally {
    if answers
        .iter()
        .all(|a| matches!(a, Some(Response::Released { held: true })))
    {
        Tally::Commit
    } else {
        Tally::Retry("a participant lost its read locks before the release".into())
    }
}

/// The decision once the silent nodes answered `lost_vote_queries`. Only "holds a commit
/// vote" can be trusted: a node that answers "no vote" may have collected the tid after it
/// committed everywhere (collected tids look like ones never seen), so a writing
/// minitransaction is then `Unknown`, never retried; a read-only one may be retried.
pub(crate) fn resolve(plan: &Plan<'_>, replies: &[NodeReply], answers: &[(Tid, bool)]) -> Tally {
    let voted_ok = replies.iter().all(|r| match r {
        NodeReply::Vote(v) => v.vote == Vote::CommitOk,
        NodeReply::Lost(_) => true,
        _ => false,
    });
    if voted_ok && answers.iter().all(|(_, ok)| *ok) {
        return Tally::Commit;
    }
    match plan
        .nodes()
        .iter()
        .zip(replies)
        .find(|(_, r)| matches!(r, NodeReply::Lost(_)))
    {
        Some((&node, NodeReply::Lost(why))) if !plan.read_only() => Tally::Unknown {
            node,
            why: format!("{why}; it holds no vote now, as if it never voted or collected the tid after committing"),
        },
        _ => Tally::Retry("a node's reply was lost and the read-only attempt aborted".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(vote: Vote) -> NodeReply {
        NodeReply::Vote(VoteReply {
            vote,
            reads: vec![],
            failed_compares: vec![],
            epoch: 1,
            lsn: 0,
        })
    }

    #[test]
    fn a_commit_carries_lsns_only_when_every_participant_logged_and_answered() {
        let logged = |lsn| match vote(Vote::CommitOk) {
            NodeReply::Vote(v) => NodeReply::Vote(VoteReply { lsn, ..v }),
            other => other,
        };
        assert_eq!(commit_lsns(&[logged(7), logged(3)]), vec![7, 3]);
        assert!(commit_lsns(&[logged(7), vote(Vote::CommitOk)]).is_empty());
        assert!(commit_lsns(&[logged(7), NodeReply::Lost("gone".into())]).is_empty());
    }

    #[test]
    fn decision_rule() {
        let nodes = [1, 2];
        assert_eq!(
            tally(&nodes, &[vote(Vote::CommitOk), vote(Vote::CommitOk)]),
            Tally::Commit
        );
        assert_eq!(
            tally(&nodes, &[vote(Vote::CommitOk), vote(Vote::AbortCompare)]),
            Tally::AbortCompare
        );
        assert!(matches!(
            tally(&nodes, &[vote(Vote::AbortLock), vote(Vote::AbortCompare)]),
            Tally::Retry(_)
        ));
        assert_eq!(
            tally(&nodes, &[vote(Vote::CommitOk), NodeReply::Lost("x".into())]),
            Tally::Unknown {
                node: 2,
                why: "x".into()
            }
        );
        // A known abort vote decides even if another vote is lost.
        assert!(matches!(
            tally(
                &nodes,
                &[vote(Vote::AbortForced), NodeReply::Lost("x".into())]
            ),
            Tally::Retry(_)
        ));
        assert_eq!(
            tally(
                &nodes,
                &[
                    vote(Vote::CommitOk),
                    NodeReply::Refused(ErrorCode::OutOfRange, "far".into())
                ]
            ),
            Tally::Rejected {
                node: 2,
                message: "far".into()
            }
        );
    }
}
