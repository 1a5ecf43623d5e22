//! The coordinator of one minitransaction (Sinfonia Fig. 4 lines 1–10) as a sans-I/O state
//! machine: it takes replies, timer expiries and the time, and returns the requests to send,
//! the one-way decisions, the timer to set and, once decided, the outcome. The async
//! `Cluster` and the simulator drive this same code; the coordinator keeps no log.
//!
//! One attempt runs under one tid: optionally the items executed ahead (Fig. 17 Systems A
//! and B), then EXEC&PREPARE to every participant, then, if a vote was lost, REQUEST-ABORT
//! to the silent nodes, or, for a read-only minitransaction over several nodes, RELEASE.
//! A transient abort ends the attempt and asks the driver for a new tid after a randomized
//! exponential backoff, until the deadline.

use crate::plan::{self, split, NodeReply, Plan, Tally};
use crate::{ExecError, Minitx, Outcome};
use std::borrow::Cow;
use tutti_wire::{Decision, NodeId, Request, Response, Tid, Vote, LOCK_WAIT_MS_MAX};

/// How long a node may keep an attempt that starts at `now_us` waiting for busy locks: a
/// quarter of what is left before the deadline, at most `LOCK_WAIT_MS_MAX`, so that its
/// vote (ABORT-LOCK at worst) is back before the deadline and the outcome is known.
fn lock_wait_ms(now_us: u64, deadline_us: u64) -> u32 {
    let quarter_ms = deadline_us.saturating_sub(now_us) / 4_000;
    quarter_ms.min(u64::from(LOCK_WAIT_MS_MAX)) as u32
}

/// Names one request of a coordinator, so that its reply can be matched to it.
pub type CallId = u64;

/// How the items are executed before the commit protocol (`Cluster::exec_and_commit_ahead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecuteAhead {
    /// One request per item, one after the other (Sinfonia Fig. 17, System A).
    PerItem,
    /// One request per node, all at once (System B).
    PerNode,
}

/// Times in microseconds on the driver's clock (any origin, never going back).
#[derive(Clone, Debug)]
pub struct Config {
    /// How long the minitransaction may take, retries included.
    pub deadline_us: u64,
    /// How long a round waits for a reply before counting it as lost. `None`: until the
    /// deadline, for a transport that reports a broken connection as soon as it breaks
    /// (TCP); a network that drops messages silently needs `Some`.
    pub reply_timeout_us: Option<u64>,
    pub backoff_initial_us: u64,
    pub backoff_max_us: u64,
    pub ahead: Option<ExecuteAhead>,
}

/// A request to send to `node`; its reply goes back through `Coordinator::on_reply`.
#[derive(Debug)]
pub struct Call {
    pub id: CallId,
    pub node: NodeId,
    pub request: Request,
}

/// What the coordinator asks its driver to do after a step, in this order: send the
/// decisions and calls, (re)set the timer, then act on `next`.
#[derive(Debug, Default)]
pub struct Actions {
    pub calls: Vec<Call>,
    /// One-way phase-2 outcomes; nothing answers them.
    pub decisions: Vec<(NodeId, Decision)>,
    /// Call `on_timer` at this time (replaces any earlier timer; one that fires late or
    /// after being replaced does nothing).
    pub timer_at_us: Option<u64>,
    /// The highest epoch named by a vote in this step (0 if none): tids of later attempts
    /// carry at least this epoch (Sinfonia §4.6).
    pub epoch_seen: u64,
    pub next: Next,
}

#[derive(Debug, Default)]
pub enum Next {
    /// Wait for replies or the timer.
    #[default]
    Wait,
    /// The attempt aborted for a transient reason: call `begin` with a new tid at this time.
    Retry { at_us: u64 },
    /// Decided. Calls still outstanding may be dropped.
    Done(Result<Outcome, ExecError>),
}

/// The replies of one round of calls, by position.
struct Round {
    /// The call asked at each position so far.
    asked: Vec<CallId>,
    replies: Vec<Option<NodeReply>>,
}

impl Round {
    fn new(positions: usize) -> Round {
        Round {
            asked: Vec::with_capacity(positions),
            replies: vec![None; positions],
        }
    }

    /// Keeps the first reply to `call`; false if the call is not this round's.
    fn record(&mut self, call: CallId, reply: NodeReply) -> bool {
        match self.asked.iter().position(|&c| c == call) {
            Some(i) if self.replies[i].is_none() => {
                self.replies[i] = Some(reply);
                true
            }
            _ => false,
        }
    }

    fn answered(&self) -> usize {
        self.replies.iter().filter(|r| r.is_some()).count()
    }

    fn complete(&self) -> bool {
        self.answered() == self.replies.len()
    }

    /// The replies so far; a call not answered counts as lost (it may have been delivered).
    fn into_replies(self) -> Vec<NodeReply> {
        let missing =
            || NodeReply::Lost("no reply before the reply timeout or the deadline".into());
        self.replies
            .into_iter()
            .map(|r| r.unwrap_or_else(missing))
            .collect()
    }
}

/// Items executed ahead of phase 1: the requests not sent yet (System A sends the next
/// only after the previous one executed), the nodes and item positions of all of them.
struct Ahead {
    unsent: std::collections::VecDeque<(NodeId, Request)>,
    nodes: Vec<NodeId>,
    positions: Vec<Vec<usize>>,
    round: Round,
}

/// One REQUEST-ABORT of lost-vote resolution, asked again until a node answers it.
struct Query {
    node: NodeId,
    request: Request,
    calls: Vec<CallId>,
    answered: bool,
    /// The last call failed (or timed out): ask again at the timer.
    failed: bool,
}

enum Phase {
    /// Before `begin`, or between attempts.
    Idle,
    Ahead(Ahead),
    Prepare(Round),
    /// Phase-1 replies (one lost) and the REQUEST-ABORTs that fix the outcome.
    Resolve {
        replies: Vec<NodeReply>,
        queries: Vec<Query>,
        answers: Vec<(Tid, bool)>,
    },
    /// Phase-1 replies of a committed read-only minitransaction, and the RELEASE round.
    Release {
        replies: Vec<NodeReply>,
        round: Round,
    },
    Done,
}

/// The control flow of one minitransaction, from its first attempt to its outcome.
pub struct Coordinator<'a> {
    plan: Plan<'a>,
    cfg: Config,
    /// A write on one `ram` node leaves no record to ask about after a lost vote.
    unrecorded: bool,
    jitter_seed: u64,
    deadline_us: u64,
    backoff_us: u64,
    attempts: u32,
    /// When the current attempt began, and the longest phase 1 an attempt of this
    /// coordinator took with every reply in: a retry needs twice that before the deadline.
    began_us: u64,
    round_us: u64,
    tid: Tid,
    next_call: CallId,
    timer_at_us: Option<u64>,
    phase: Phase,
}

impl<'a> Coordinator<'a> {
    /// A coordinator for `tx`, started at `now_us`. `durable` tells whether a memory node
    /// logs its votes; `jitter_seed` makes the backoff's randomness the driver's choice.
    pub fn new(
        tx: Cow<'a, Minitx>,
        cfg: Config,
        now_us: u64,
        durable: impl Fn(NodeId) -> bool,
        jitter_seed: u64,
    ) -> Coordinator<'a> {
        let plan = split(tx);
        let unrecorded = match plan.nodes() {
            [node] => !plan.read_only() && !durable(*node),
            _ => false,
        };
        Coordinator {
            unrecorded,
            jitter_seed,
            deadline_us: now_us.saturating_add(cfg.deadline_us),
            backoff_us: cfg.backoff_initial_us,
            attempts: 0,
            began_us: now_us,
            round_us: 0,
            tid: Tid {
                epoch: 0,
                coordinator: 0,
                seq: 0,
            },
            next_call: 1,
            timer_at_us: None,
            phase: Phase::Idle,
            plan,
            cfg,
        }
    }

    /// When `on_timer` is due, if a timer is set.
    pub fn timer_at_us(&self) -> Option<u64> {
        self.timer_at_us
    }

    /// Starts an attempt under `tid`, which no earlier attempt of any coordinator used.
    pub fn begin(&mut self, now_us: u64, tid: Tid) -> Actions {
        assert!(
            matches!(self.phase, Phase::Idle),
            "begin while an attempt is under way"
        );
        self.tid = tid;
        self.attempts += 1;
        self.began_us = now_us;
        let mut acts = Actions::default();
        match self.cfg.ahead {
            Some(ahead) => {
                let per_item = ahead == ExecuteAhead::PerItem;
                let requests = self.plan.execute_ahead_requests(tid, per_item);
                let mut round = Round::new(requests.len());
                let nodes = requests.iter().map(|(node, _, _)| *node).collect();
                let mut positions = Vec::with_capacity(requests.len());
                let mut unsent = std::collections::VecDeque::with_capacity(requests.len());
                for (node, request, at) in requests {
                    positions.push(at);
                    unsent.push_back((node, request));
                }
                let now_sent = if per_item { 1 } else { unsent.len() };
                for (node, request) in unsent.drain(..now_sent).collect::<Vec<_>>() {
                    round.asked.push(self.call(&mut acts, node, request));
                }
                self.phase = Phase::Ahead(Ahead {
                    unsent,
                    nodes,
                    positions,
                    round,
                });
            }
            None => {
                let requests = self
                    .plan
                    .requests(tid, lock_wait_ms(now_us, self.deadline_us));
                self.prepare(&mut acts, requests);
            }
        }
        self.arm_round(&mut acts, now_us);
        acts
    }

    /// The reply to `call`: a node's response, or what the driver knows of its fate.
    pub fn on_reply(&mut self, now_us: u64, call: CallId, reply: NodeReply) -> Actions {
        let mut acts = Actions::default();
        if let NodeReply::Vote(v) = &reply {
            acts.epoch_seen = v.epoch;
        }
        match &mut self.phase {
            Phase::Ahead(ahead) => {
                let executed = matches!(&reply, NodeReply::Vote(v) if v.vote == Vote::CommitOk);
                if !ahead.round.record(call, reply) {
                    return acts;
                }
                if executed && !ahead.unsent.is_empty() {
                    let (node, request) = ahead.unsent.pop_front().expect("not empty");
                    let id = add_call(&mut self.next_call, &mut acts, node, request);
                    ahead.round.asked.push(id);
                    self.arm_round(&mut acts, now_us);
                } else if ahead.round.answered() == ahead.round.asked.len() {
                    // Every request sent is answered, and none is left to send or the
                    // last one did not execute (System A stops there).
                    self.ahead_done(&mut acts, now_us);
                }
            }
            Phase::Prepare(round) => {
                if round.record(call, reply) && round.complete() {
                    self.round_us = self.round_us.max(now_us.saturating_sub(self.began_us));
                    self.proceed(&mut acts, now_us);
                }
            }
            Phase::Resolve { .. } => self.on_answer(&mut acts, now_us, call, reply),
            Phase::Release { round, .. } => {
                if round.record(call, reply) && round.complete() {
                    self.release_done(&mut acts, now_us);
                }
            }
            Phase::Idle | Phase::Done => {}
        }
        acts
    }

    /// The timer set by an earlier step expired (an early or stale call does nothing).
    pub fn on_timer(&mut self, now_us: u64) -> Actions {
        let mut acts = Actions::default();
        if self.timer_at_us.is_none_or(|at| now_us < at) {
            return acts;
        }
        self.timer_at_us = None;
        match &mut self.phase {
            Phase::Ahead(_) => self.ahead_done(&mut acts, now_us),
            Phase::Prepare(_) => self.proceed(&mut acts, now_us),
            Phase::Resolve { .. } if now_us >= self.deadline_us => {
                let Phase::Resolve { replies, .. } =
                    std::mem::replace(&mut self.phase, Phase::Idle)
                else {
                    unreachable!("resolving")
                };
                let (node, lost) = lost_node(self.plan.nodes(), &replies);
                let why = format!("{lost}; REQUEST-ABORT got no answer before the deadline");
                self.finish(&mut acts, now_us, replies, Tally::Unknown { node, why });
            }
            Phase::Resolve { .. } => self.ask_again(&mut acts, now_us),
            Phase::Release { .. } => self.release_done(&mut acts, now_us),
            Phase::Idle | Phase::Done => {}
        }
        acts
    }

    fn call(&mut self, acts: &mut Actions, node: NodeId, request: Request) -> CallId {
        add_call(&mut self.next_call, acts, node, request)
    }

    fn set_timer(&mut self, acts: &mut Actions, at_us: u64) {
        let at_us = at_us.min(self.deadline_us);
        self.timer_at_us = Some(at_us);
        acts.timer_at_us = Some(at_us);
    }

    /// A new round waits for its replies at most the reply timeout, and never past the
    /// deadline.
    fn arm_round(&mut self, acts: &mut Actions, now_us: u64) {
        let timeout = self.cfg.reply_timeout_us.unwrap_or(u64::MAX);
        self.set_timer(acts, now_us.saturating_add(timeout));
    }

    fn prepare(&mut self, acts: &mut Actions, requests: Vec<(NodeId, Request)>) {
        let mut round = Round::new(requests.len());
        for (node, request) in requests {
            round.asked.push(self.call(acts, node, request));
        }
        self.phase = Phase::Prepare(round);
    }

    /// Every item executed ahead (start phase 1 without items) or one did not (abort).
    fn ahead_done(&mut self, acts: &mut Actions, now_us: u64) {
        let Phase::Ahead(ahead) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            unreachable!("executing ahead")
        };
        let sent = ahead.round.asked.len();
        let mut replies = ahead.round.into_replies();
        replies.truncate(sent);
        let Some(tally) = plan::tally_execute_ahead(&ahead.nodes[..sent], &replies) else {
            let requests = self.plan.requests_after_execute_ahead(self.tid);
            self.prepare(acts, requests);
            return self.arm_round(acts, now_us);
        };
        if tally != Tally::AbortCompare {
            return self.finish(acts, now_us, replies, tally);
        }
        self.decide(acts, false, Vec::new());
        let mut failed: Vec<usize> = Vec::new();
        for (positions, reply) in ahead.positions.iter().zip(&replies) {
            if let NodeReply::Vote(v) = reply {
                let found = v.failed_compares.iter();
                failed.extend(found.filter_map(|&k| positions.get(k as usize).copied()));
            }
        }
        failed.sort_unstable();
        self.done(
            acts,
            Ok(Outcome {
                committed: false,
                reads: Vec::new(),
                failed_compares: failed,
            }),
        );
    }

    /// Phase 1 is over (every reply in, or the timer): decide, or find out a lost vote.
    fn proceed(&mut self, acts: &mut Actions, now_us: u64) {
        let Phase::Prepare(round) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            unreachable!("in phase 1")
        };
        let replies = round.into_replies();
        let tally = plan::tally(self.plan.nodes(), &replies);
        if !matches!(tally, Tally::Unknown { .. }) {
            return self.settle(acts, now_us, replies, tally);
        }
        let unrecorded = self.unrecorded;
        match plan::lost_vote_queries(&self.plan, self.tid, &replies, |_| !unrecorded) {
            Err(tally) => self.finish(acts, now_us, replies, tally),
            Ok(requests) => {
                let queries = requests
                    .into_iter()
                    .map(|(node, request)| Query {
                        node,
                        request,
                        calls: Vec::new(),
                        answered: false,
                        failed: true,
                    })
                    .collect();
                self.phase = Phase::Resolve {
                    replies,
                    queries,
                    answers: Vec::new(),
                };
                self.ask_again(acts, now_us);
            }
        }
    }

    /// Asks every unanswered REQUEST-ABORT whose last call failed or timed out.
    fn ask_again(&mut self, acts: &mut Actions, now_us: u64) {
        let Phase::Resolve { queries, .. } = &mut self.phase else {
            unreachable!("resolving")
        };
        let resend = self.cfg.reply_timeout_us.is_some();
        for q in queries
            .iter_mut()
            .filter(|q| !q.answered && (q.failed || resend))
        {
            q.failed = false;
            let id = add_call(&mut self.next_call, acts, q.node, q.request.clone());
            q.calls.push(id);
        }
        self.arm_round(acts, now_us);
    }

    fn on_answer(&mut self, acts: &mut Actions, now_us: u64, call: CallId, reply: NodeReply) {
        let Phase::Resolve {
            queries, answers, ..
        } = &mut self.phase
        else {
            unreachable!("resolving")
        };
        let Some(q) = queries.iter_mut().find(|q| q.calls.contains(&call)) else {
            return;
        };
        if q.answered {
            return;
        }
        match reply {
            NodeReply::Other(Response::Votes(votes)) => {
                q.answered = true;
                answers.extend(votes);
            }
            _ => {
                // Ask again soon, not in a tight loop with a node that keeps refusing.
                q.failed = true;
                let soon = now_us.saturating_add(self.cfg.backoff_max_us);
                if self.timer_at_us.is_none_or(|at| at > soon) {
                    self.set_timer(acts, soon);
                }
                return;
            }
        }
        if !queries.iter().all(|q| q.answered) {
            return;
        }
        let Phase::Resolve {
            replies, answers, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            unreachable!("resolving")
        };
        let tally = plan::resolve(&self.plan, &replies, &answers);
        self.settle(acts, now_us, replies, tally);
    }

    /// A commit of a read-only minitransaction over several nodes first needs every
    /// participant to confirm it still held its read locks (RELEASE).
    fn settle(&mut self, acts: &mut Actions, now_us: u64, replies: Vec<NodeReply>, tally: Tally) {
        let multi = self.plan.nodes().len() > 1;
        if tally != Tally::Commit || !self.plan.read_only() || !multi {
            return self.finish(acts, now_us, replies, tally);
        }
        let releases = plan::releases(&self.plan, self.tid);
        let mut round = Round::new(releases.len());
        for (node, request) in releases {
            round.asked.push(self.call(acts, node, request));
        }
        self.phase = Phase::Release { replies, round };
        self.arm_round(acts, now_us);
    }

    fn release_done(&mut self, acts: &mut Actions, now_us: u64) {
        let Phase::Release { replies, round } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            unreachable!("releasing")
        };
        let answers: Vec<Option<Response>> = (round.replies.into_iter())
            .map(|r| match r {
                Some(NodeReply::Other(resp)) => Some(resp),
                _ => None,
            })
            .collect();
        let tally = plan::released(&answers);
        self.finish(acts, now_us, replies, tally);
    }

    /// Phase 2 and the outcome of the attempt, from its phase-1 `replies`.
    fn finish(&mut self, acts: &mut Actions, now_us: u64, replies: Vec<NodeReply>, tally: Tally) {
        let tid = self.tid;
        match tally {
            Tally::Commit | Tally::AbortCompare => {
                let commit = tally == Tally::Commit;
                if !commit || !self.plan.read_only() {
                    let lsns = if commit {
                        plan::commit_lsns(&replies)
                    } else {
                        Vec::new()
                    };
                    self.decide(acts, commit, lsns);
                }
                // A lost reply that carried reads retries an abort; a commit stays one.
                match self.plan.outcome(tid, &replies, commit) {
                    Ok(Ok(outcome)) => self.done(acts, Ok(outcome)),
                    Ok(Err(reason)) => self.retry(acts, now_us, reason),
                    Err(e) => self.done(acts, Err(e)),
                }
            }
            Tally::Retry(reason) => {
                self.decide(acts, false, Vec::new());
                self.retry(acts, now_us, reason);
            }
            Tally::Rejected { node, message } => {
                self.decide(acts, false, Vec::new());
                self.done(acts, Err(ExecError::Rejected { node, message }));
            }
            Tally::Unknown { node, why } => {
                self.done(acts, Err(ExecError::OutcomeUnknown { tid, node, why }))
            }
        }
    }

    /// Phase 2: one-way decisions to every participant. A single participant decided on
    /// its own (one-phase commit), unless it holds items executed ahead.
    fn decide(&mut self, acts: &mut Actions, commit: bool, lsns: Vec<u64>) {
        if self.plan.nodes().len() < 2 && self.cfg.ahead.is_none() {
            return;
        }
        let decision = Decision {
            tid: self.tid,
            commit,
            lsns,
        };
        let nodes = self.plan.nodes();
        acts.decisions
            .extend(nodes.iter().map(|&node| (node, decision.clone())));
    }

    /// Another attempt after a randomized exponential backoff, if the deadline allows it
    /// and twice the longest phase 1 seen after the pause: an attempt whose votes are not
    /// all back by the deadline may have committed, and ends with its outcome unknown,
    /// where not starting it ends with a clean timeout.
    fn retry(&mut self, acts: &mut Actions, now_us: u64, reason: String) {
        let pause_us = self.backoff_us / 2
            + jitter(self.jitter_seed, self.attempts) % (self.backoff_us / 2 + 1);
        let needs_us = pause_us.saturating_add(2 * self.round_us);
        if now_us.saturating_add(needs_us) >= self.deadline_us {
            let attempts = self.attempts;
            return self.done(
                acts,
                Err(ExecError::Timeout {
                    attempts,
                    last: reason,
                }),
            );
        }
        self.backoff_us = (self.backoff_us * 2).min(self.cfg.backoff_max_us);
        self.timer_at_us = None;
        acts.next = Next::Retry {
            at_us: now_us + pause_us,
        };
    }

    fn done(&mut self, acts: &mut Actions, result: Result<Outcome, ExecError>) {
        self.phase = Phase::Done;
        self.timer_at_us = None;
        acts.next = Next::Done(result);
    }
}

/// Adds a call to `acts` under the next id of its coordinator.
fn add_call(next: &mut CallId, acts: &mut Actions, node: NodeId, request: Request) -> CallId {
    let id = *next;
    *next += 1;
    acts.calls.push(Call { id, node, request });
    id
}

/// The first participant whose vote was lost, and why.
fn lost_node(nodes: &[NodeId], replies: &[NodeReply]) -> (NodeId, String) {
    (nodes.iter().zip(replies))
        .find_map(|(&node, r)| match r {
            NodeReply::Lost(why) => Some((node, why.clone())),
            _ => None,
        })
        .unwrap_or((nodes[0], "no vote was lost".into()))
}

/// SplitMix64 of (seed, attempt): the backoff's randomness, reproducible from the seed.
fn jitter(seed: u64, attempt: u32) -> u64 {
    let mut z = seed.wrapping_add(u64::from(attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Deliberate bugs in the coordinator that prove the simulator's checkers can fail. They
/// exist only with the `planted-bugs` feature; without it `planted` is always false.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bug {
    /// A vote lost with its reply counts as COMMIT-OK: the coordinator may report (and
    /// decide) a commit that a participant voted against.
    LostVoteCountsAsCommit,
}

tutti_wire::planted_bugs!(Bug);

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_wire::VoteReply;

    fn cfg(ahead: Option<ExecuteAhead>) -> Config {
        Config {
            deadline_us: 1_000_000,
            reply_timeout_us: Some(30_000),
            backoff_initial_us: 200,
            backoff_max_us: 100_000,
            ahead,
        }
    }

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 9,
            seq,
        }
    }

    fn vote(vote: Vote, failed: Vec<u32>, lsn: u64) -> NodeReply {
        NodeReply::Vote(VoteReply {
            vote,
            reads: vec![],
            failed_compares: failed,
            epoch: 1,
            lsn,
        })
    }

    fn two_node_swap() -> Minitx {
        Minitx::new()
            .compare(2, 0, vec![1])
            .write(2, 0, vec![2])
            .compare(1, 0, vec![1])
            .write(1, 0, vec![2])
    }

    fn done(acts: Actions) -> Result<Outcome, ExecError> {
        match acts.next {
            Next::Done(result) => result,
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn two_commit_votes_decide_a_commit_with_every_lsn() {
        let mut co = Coordinator::new(Cow::Owned(two_node_swap()), cfg(None), 0, |_| true, 1);
        let acts = co.begin(0, tid(1));
        assert_eq!(acts.calls.len(), 2);
        assert_eq!(acts.timer_at_us, Some(30_000));
        let (a, b) = (acts.calls[0].id, acts.calls[1].id);
        assert!(matches!(
            co.on_reply(10, a, vote(Vote::CommitOk, vec![], 7)).next,
            Next::Wait
        ));
        let acts = co.on_reply(20, b, vote(Vote::CommitOk, vec![], 3));
        let lsns: Vec<_> = acts
            .decisions
            .iter()
            .map(|(n, d)| (*n, d.commit, d.lsns.clone()))
            .collect();
        assert_eq!(lsns, vec![(1, true, vec![7, 3]), (2, true, vec![7, 3])]);
        assert!(done(acts).expect("decided").committed);
    }

    #[test]
    fn executing_ahead_per_node_waits_for_every_node() {
        let tx = Minitx::new().compare(3, 0, vec![1]).compare(1, 0, vec![1]);
        let ahead = Some(ExecuteAhead::PerNode);
        let mut co = Coordinator::new(Cow::Owned(tx), cfg(ahead), 0, |_| true, 1);
        let acts = co.begin(0, tid(1));
        let ids: Vec<_> = acts.calls.iter().map(|c| (c.node, c.id)).collect();
        assert_eq!(ids.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![3, 1]);
        let first = co.on_reply(10, ids[0].1, vote(Vote::AbortCompare, vec![0], 0));
        assert!(
            matches!(first.next, Next::Wait),
            "one node has not answered"
        );
        let acts = co.on_reply(20, ids[1].1, vote(Vote::AbortCompare, vec![0], 0));
        assert_eq!(
            acts.decisions.len(),
            2,
            "both nodes hold items executed ahead"
        );
        assert_eq!(done(acts).expect("decided").failed_compares, vec![0, 1]);
    }

    #[test]
    fn executing_ahead_per_item_stops_at_the_first_failed_item() {
        let tx = Minitx::new().compare(3, 0, vec![1]).compare(1, 0, vec![1]);
        let ahead = Some(ExecuteAhead::PerItem);
        let mut co = Coordinator::new(Cow::Owned(tx), cfg(ahead), 0, |_| true, 1);
        let acts = co.begin(0, tid(1));
        assert_eq!(acts.calls.len(), 1, "one item at a time");
        let acts = co.on_reply(10, acts.calls[0].id, vote(Vote::AbortCompare, vec![0], 0));
        assert!(acts.calls.is_empty());
        assert_eq!(done(acts).expect("decided").failed_compares, vec![0]);
    }

    #[test]
    fn a_lost_vote_is_asked_for_and_decides_once_answered() {
        let mut co = Coordinator::new(Cow::Owned(two_node_swap()), cfg(None), 0, |_| true, 1);
        let acts = co.begin(0, tid(1));
        co.on_reply(10, acts.calls[0].id, vote(Vote::CommitOk, vec![], 4));
        assert!(
            co.on_timer(29_999).calls.is_empty(),
            "early timers do nothing"
        );
        let acts = co.on_timer(30_000);
        assert_eq!(acts.calls.len(), 1);
        assert_eq!(acts.calls[0].node, 2);
        assert!(matches!(
            acts.calls[0].request,
            Request::RequestAbort { .. }
        ));
        let query = acts.calls[0].id;
        // No answer within the reply timeout: asked again, under a new call.
        let again = co.on_timer(60_000);
        assert_eq!(again.calls.len(), 1);
        let votes = NodeReply::Other(Response::Votes(vec![(tid(1), true)]));
        let acts = co.on_reply(70_000, query, votes);
        assert!(acts
            .decisions
            .iter()
            .all(|(_, d)| d.commit && d.lsns.is_empty()));
        assert!(done(acts).expect("decided").committed);
    }

    #[test]
    fn a_busy_lock_retries_after_backoff_until_the_deadline() {
        let mut co = Coordinator::new(Cow::Owned(two_node_swap()), cfg(None), 0, |_| true, 1);
        let (mut now, mut seq, mut attempts) = (0, 1, 0);
        let result = loop {
            let acts = co.begin(now, tid(seq));
            attempts += 1;
            let ids: Vec<_> = acts.calls.iter().map(|c| c.id).collect();
            co.on_reply(now, ids[0], vote(Vote::CommitOk, vec![], 1));
            let acts = co.on_reply(now, ids[1], vote(Vote::AbortLock, vec![], 0));
            assert!(acts
                .decisions
                .iter()
                .all(|(_, d)| !d.commit && d.tid == tid(seq)));
            match acts.next {
                Next::Retry { at_us } => {
                    assert!(at_us > now);
                    now = at_us;
                    seq += 1;
                }
                Next::Done(result) => break result,
                Next::Wait => panic!("both replies are in"),
            }
        };
        assert!(now < 1_000_000);
        match result {
            Err(ExecError::Timeout { attempts: a, .. }) => assert_eq!(a, attempts),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    /// A retry whose attempt could not have its votes back before the deadline (twice the
    /// longest phase 1 seen) is not started: the minitransaction times out with its
    /// outcome known.
    #[test]
    fn no_retry_starts_without_two_rounds_left_before_the_deadline() {
        let mut co = Coordinator::new(Cow::Owned(two_node_swap()), cfg(None), 0, |_| true, 1);
        // Phase 1 takes 300 ms: the retry after it (at about 300 ms plus a pause) would
        // need until 900 ms at least, inside the 1 s deadline.
        let acts = co.begin(0, tid(1));
        let ids: Vec<_> = acts.calls.iter().map(|c| c.id).collect();
        co.on_reply(300_000, ids[0], vote(Vote::CommitOk, vec![], 1));
        let acts = co.on_reply(300_000, ids[1], vote(Vote::AbortLock, vec![], 0));
        let Next::Retry { at_us } = acts.next else {
            panic!("expected a retry, got {:?}", acts.next);
        };
        // The second attempt's phase 1 takes as long; the next retry would end past 1 s.
        let acts = co.begin(at_us, tid(2));
        let ids: Vec<_> = acts.calls.iter().map(|c| c.id).collect();
        let now = at_us + 300_000;
        co.on_reply(now, ids[0], vote(Vote::CommitOk, vec![], 1));
        let acts = co.on_reply(now, ids[1], vote(Vote::AbortLock, vec![], 0));
        match acts.next {
            Next::Done(Err(ExecError::Timeout { attempts: 2, .. })) => {}
            other => panic!("expected a timeout after 2 attempts, got {other:?}"),
        }
    }

    fn lock_waits(tx: Minitx, now_us: u64) -> Vec<u32> {
        let mut co = Coordinator::new(Cow::Owned(tx), cfg(None), 0, |_| true, 1);
        let acts = co.begin(now_us, tid(1));
        (acts.calls.iter())
            .map(|c| match &c.request {
                Request::ExecPrepare(ep) => ep.lock_wait_ms,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn only_a_single_node_attempt_may_wait_for_locks_and_well_inside_its_deadline() {
        let one_node = || Minitx::new().write(1, 0, vec![1; 8]);
        assert_eq!(lock_waits(one_node(), 0), vec![LOCK_WAIT_MS_MAX]);
        // 40 ms left of the 1 s deadline: a quarter of it.
        assert_eq!(lock_waits(one_node(), 960_000), vec![10]);
        assert_eq!(lock_waits(one_node(), 999_000), vec![0]);
        assert_eq!(lock_waits(two_node_swap(), 0), vec![0, 0]);
    }
}
