//! Simulated coordinators running the bank workload with the client's own decision
//! functions (`tutti_client::coordinator`): split, tally, lost-vote resolution, outcome.
//! Each transfer also writes a one-byte receipt on every node it touches, so the checker
//! can see exactly which transfers were applied where.

use crate::{Endpoint, Event, Msg, SimConfig, World};
use rand::Rng;
use std::collections::BTreeMap;
use tutti_client::coordinator::{self, NodeReply, Tally};
use tutti_client::Minitx;
use tutti_wire::{CmpOp, Decision, NodeId, Outgoing, Request, Response, Tid};

pub(crate) const SPACE_BYTES: u64 = 8192;
pub(crate) const INITIAL_BALANCE: u64 = 100;
const RECEIPTS_BASE: u64 = 1024;
/// How long a coordinator waits for replies before treating them as lost.
const REPLY_TIMEOUT_US: u64 = 30_000;
/// How long one operation may take, retries included (the client's deadline).
const OP_DEADLINE_US: u64 = 5_000_000;

pub(crate) fn accounts(cfg: &SimConfig) -> u64 {
    cfg.accounts_per_node * u64::from(cfg.nodes)
}

/// Account `i` lives on node `i % nodes + 1`.
pub(crate) fn account(cfg: &SimConfig, i: u64) -> (NodeId, u64) {
    let nodes = u64::from(cfg.nodes);
    ((i % nodes) as NodeId + 1, (i / nodes) * 8)
}

pub(crate) fn receipt(cfg: &SimConfig, coordinator: usize, k: usize) -> u64 {
    RECEIPTS_BASE + (coordinator * cfg.ops_per_coordinator + k) as u64
}

/// A node's image before anything ran: its accounts hold the initial balance.
pub(crate) fn initial_image(cfg: &SimConfig, node: NodeId) -> Vec<u8> {
    let mut image = vec![0; SPACE_BYTES as usize];
    for i in (0..accounts(cfg)).filter(|&i| account(cfg, i).0 == node) {
        let addr = account(cfg, i).1 as usize;
        image[addr..addr + 8].copy_from_slice(&INITIAL_BALANCE.to_le_bytes());
    }
    image
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpOutcome {
    Committed,
    AbortedCompare,
    Unknown,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    Transfer { from: u64, to: u64, amount: u64 },
    Audit,
}

struct Op {
    k: usize,
    kind: OpKind,
    tx: Minitx,
    deadline_us: u64,
    backoff_us: u64,
}

/// Answers so far, and the REQUEST-ABORTs awaited by message id.
type Resolving = (Vec<(Tid, bool)>, BTreeMap<u64, (NodeId, Request)>);
/// RELEASE answers by participant position, and the positions awaited by message id.
type Releasing = (Vec<Option<Response>>, BTreeMap<u64, usize>);

struct Attempt {
    id: u64,
    tid: Tid,
    nodes: Vec<NodeId>,
    replies: Vec<Option<NodeReply>>,
    asked: BTreeMap<u64, usize>,
    /// Lost-vote resolution: answers so far and the REQUEST-ABORTs awaited.
    resolving: Option<Resolving>,
    /// EXEC&PREPAREs a stalled coordinator has yet to send.
    stalled: Vec<(NodeId, Msg)>,
    /// Phase 2 of a read-only minitransaction over several nodes: RELEASE answers.
    releasing: Option<Releasing>,
    /// Items executed ahead of phase 1 (`ExecuteAhead`), while that is still going on.
    ahead: Option<Ahead>,
    /// Some node may hold items of this attempt executed ahead: an abort must reach every
    /// node, even when there is only one.
    executed_ahead: bool,
}

/// `ExecuteAhead` requests' nodes and replies, and their positions by message id.
struct Ahead {
    nodes: Vec<NodeId>,
    replies: Vec<Option<NodeReply>>,
    asked: BTreeMap<u64, usize>,
}

pub(crate) struct SimCoordinator {
    coordinator_id: u64,
    seq: u64,
    epoch: u64,
    next_k: usize,
    ops_total: usize,
    op: Option<Op>,
    attempt: Option<Attempt>,
    crashed: bool,
    outcomes: Vec<(usize, OpKind, OpOutcome)>,
    /// Totals seen by committed audits.
    pub(crate) audits: Vec<u64>,
    pub(crate) errors: Vec<String>,
}

impl SimCoordinator {
    pub(crate) fn new(index: usize, cfg: &SimConfig) -> SimCoordinator {
        SimCoordinator {
            coordinator_id: index as u64 + 1,
            seq: 1,
            epoch: 1,
            next_k: 0,
            ops_total: cfg.ops_per_coordinator,
            op: None,
            attempt: None,
            crashed: false,
            outcomes: Vec::new(),
            audits: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Attempt `id`, if it is still the current one of a coordinator that has not crashed.
    fn live_attempt(&mut self, id: u64) -> Option<&mut Attempt> {
        self.attempt
            .as_mut()
            .filter(|a| a.id == id && !self.crashed)
    }

    pub(crate) fn done(&self) -> bool {
        self.next_k == self.ops_total && self.op.is_none() && !self.crashed
    }

    pub(crate) fn outcomes(&self) -> impl Iterator<Item = OpOutcome> + '_ {
        self.outcomes.iter().map(|o| o.2)
    }

    pub(crate) fn transfers(&self) -> impl Iterator<Item = (usize, u64, u64, u64, OpOutcome)> + '_ {
        self.outcomes
            .iter()
            .filter_map(|&(k, kind, outcome)| match kind {
                OpKind::Transfer { from, to, amount } => Some((k, from, to, amount, outcome)),
                OpKind::Audit => None,
            })
    }
}

fn build(world: &mut World, c: usize, k: usize) -> (OpKind, Minitx) {
    let cfg = world.cfg.clone();
    let n = accounts(&cfg);
    if world.rng.gen_bool(0.15) {
        let tx = (0..n).fold(Minitx::new().class("audit"), |tx, i| {
            let (node, addr) = account(&cfg, i);
            tx.read(node, addr, 8)
        });
        return (OpKind::Audit, tx);
    }
    let from = world.rng.gen_range(0..n);
    let to = (from + world.rng.gen_range(1..n)) % n;
    let amount = world.rng.gen_range(1..=30u64);
    let ((nf, af), (nt, at)) = (account(&cfg, from), account(&cfg, to));
    let r = receipt(&cfg, c, k);
    let mut tx = Minitx::new()
        .class("transfer")
        .compare_u64(nf, af, CmpOp::Ge, amount)
        .add(nf, af, -(amount as i64))
        .add(nt, at, amount as i64)
        .write(nf, r, vec![1]);
    if nt != nf {
        tx = tx.write(nt, r, vec![1]);
    }
    (OpKind::Transfer { from, to, amount }, tx)
}

pub(crate) fn start_next(world: &mut World, c: usize) {
    let k = world.coordinators[c].next_k;
    if k == world.coordinators[c].ops_total {
        return;
    }
    let (kind, tx) = build(world, c, k);
    let deadline_us = world.now_us + OP_DEADLINE_US;
    let co = &mut world.coordinators[c];
    co.next_k += 1;
    co.op = Some(Op {
        k,
        kind,
        tx,
        deadline_us,
        backoff_us: 200,
    });
    begin_attempt(world, c);
}

fn begin_attempt(world: &mut World, c: usize) {
    let id = world.new_id();
    let co = &mut world.coordinators[c];
    let op = co.op.as_ref().expect("an operation");
    let tid = Tid {
        epoch: co.epoch,
        coordinator: co.coordinator_id,
        seq: co.seq,
    };
    co.seq += 1;
    let tx = op.tx.clone();
    let plan = coordinator::split(&tx);
    let nodes = plan.nodes().to_vec();
    let mut attempt = Attempt {
        id,
        tid,
        replies: vec![None; nodes.len()].into_iter().collect(),
        nodes,
        asked: BTreeMap::new(),
        resolving: None,
        stalled: Vec::new(),
        releasing: None,
        ahead: None,
        executed_ahead: false,
    };
    if world.rng.gen_bool(world.cfg.execute_ahead_probability) {
        let per_item = world.rng.gen_bool(0.5);
        let requests: Vec<(NodeId, Request)> = plan
            .execute_ahead_requests(tid, per_item)
            .into_iter()
            .map(|(node, req, _)| (node, req))
            .collect();
        attempt.ahead = Some(Ahead {
            nodes: requests.iter().map(|(node, _)| *node).collect(),
            replies: vec![None; requests.len()],
            asked: BTreeMap::new(),
        });
        attempt.executed_ahead = true;
        world.coordinators[c].attempt = Some(attempt);
        let ids = send_requests(world, c, requests);
        let ahead = world.coordinators[c]
            .attempt
            .as_mut()
            .and_then(|a| a.ahead.as_mut())
            .expect("executing ahead");
        ahead.asked = ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect();
        arm_timeout(world, c, id);
        return;
    }
    send_prepares(world, c, attempt, plan.requests(tid));
}

/// Phase 1: sends `requests` (one EXEC&PREPARE per participant) for `attempt`.
fn send_prepares(world: &mut World, c: usize, mut attempt: Attempt, requests: Outgoing) {
    let id = attempt.id;
    let mut sends = Vec::new();
    for (i, (node, req)) in requests.into_iter().enumerate() {
        let msg_id = world.new_id();
        attempt.asked.insert(msg_id, i);
        sends.push((node, Msg::Req { id: msg_id, req }));
    }
    let multi = attempt.nodes.len() > 1;
    if multi && world.faults_on() && world.rng.gen_bool(world.cfg.slow_coordinator_probability) {
        let (first, rest) = (sends.remove(0), sends);
        attempt.stalled = rest;
        sends = vec![first];
        let stall = world.rng.gen_range(120_000..400_000);
        world.at(
            stall,
            Event::CoordinatorResume {
                coordinator: c,
                attempt: id,
            },
        );
    } else {
        arm_timeout(world, c, id);
    }
    world.coordinators[c].attempt = Some(attempt);
    for (node, msg) in sends {
        world.send(Endpoint::Coordinator(c), Endpoint::Node(node), msg);
    }
    if multi && world.faults_on() && world.rng.gen_bool(world.cfg.coordinator_crash_probability) {
        // Dies between the phases: its votes stay uncertain until the manager recovers them.
        let co = &mut world.coordinators[c];
        co.crashed = true;
        co.attempt = None;
        let op = co.op.take().expect("an operation");
        co.outcomes.push((op.k, op.kind, OpOutcome::Unknown));
        world.coordinator_crashes += 1;
        let down = world.rng.gen_range(1_000..50_000);
        world.at(down, Event::CoordinatorRestart { coordinator: c });
    }
}

pub(crate) fn restart(world: &mut World, c: usize) {
    let fresh = world.rng.gen::<u64>() | 1 << 63;
    let co = &mut world.coordinators[c];
    co.crashed = false;
    co.coordinator_id = fresh;
    co.seq = 1;
    start_next(world, c);
}

pub(crate) fn deliver(world: &mut World, c: usize, msg: Msg) {
    let Msg::Resp { id, resp } = msg else { return };
    let co = &mut world.coordinators[c];
    if co.crashed {
        return;
    }
    let Some(attempt) = co.attempt.as_mut() else {
        return;
    };
    if let Some(ahead) = attempt.ahead.as_mut() {
        if let Some(&i) = ahead.asked.get(&id) {
            if record_reply(&mut co.epoch, &mut ahead.replies, i, resp) {
                ahead_done(world, c);
            }
        }
        return;
    }
    if let Some(&i) = attempt.asked.get(&id) {
        if attempt.resolving.is_none() && record_reply(&mut co.epoch, &mut attempt.replies, i, resp)
        {
            proceed(world, c);
        }
        return;
    }
    if let Some((answers, waiting)) = attempt.releasing.as_mut() {
        if let Some(i) = waiting.remove(&id) {
            answers[i] = Some(resp);
            if answers.iter().all(Option::is_some) {
                let tally = coordinator::released(answers);
                finalize(world, c, tally);
            }
        }
        return;
    }
    if let Some((answers, waiting)) = attempt.resolving.as_mut() {
        if let (Some(_), Response::Votes(votes)) = (waiting.remove(&id), resp) {
            answers.extend(votes);
            if waiting.is_empty() {
                let op = co.op.as_ref().expect("an operation");
                let tally = coordinator::resolve(
                    &coordinator::split(&op.tx),
                    &flatten(&attempt.replies),
                    answers,
                );
                settle(world, c, tally);
            }
        }
    }
}

/// Records the first reply at position `i` (learning the epoch from a vote); true once
/// every position has one.
fn record_reply(
    epoch: &mut u64,
    replies: &mut [Option<NodeReply>],
    i: usize,
    resp: Response,
) -> bool {
    if replies[i].is_some() {
        return false;
    }
    if let Response::Vote(v) = &resp {
        *epoch = (*epoch).max(v.epoch);
    }
    replies[i] = Some(NodeReply::from_response(resp));
    replies.iter().all(Option::is_some)
}

/// Every `ExecuteAhead` was answered (or timed out): run the commit protocol, or abort.
fn ahead_done(world: &mut World, c: usize) {
    let co = &mut world.coordinators[c];
    let mut attempt = co.attempt.take().expect("attempt");
    let ahead = attempt.ahead.take().expect("executing ahead");
    let replies = flatten(&ahead.replies);
    match coordinator::tally_execute_ahead(&ahead.nodes, &replies) {
        Some(tally) => {
            co.attempt = Some(attempt);
            finalize(world, c, tally)
        }
        None => {
            let op = co.op.as_ref().expect("an operation");
            let requests = coordinator::split(&op.tx).requests_after_execute_ahead(attempt.tid);
            send_prepares(world, c, attempt, requests);
        }
    }
}

fn flatten(replies: &[Option<NodeReply>]) -> Vec<NodeReply> {
    replies
        .iter()
        .map(|r| r.clone().unwrap_or(NodeReply::Lost("no reply".into())))
        .collect()
}

pub(crate) fn timeout(world: &mut World, c: usize, attempt_id: u64) {
    let now = world.now_us;
    let co = &mut world.coordinators[c];
    let Some(deadline) = co.op.as_ref().map(|op| op.deadline_us) else {
        return;
    };
    let Some(attempt) = co.live_attempt(attempt_id) else {
        return;
    };
    if let Some((answers, _)) = attempt.releasing.as_ref() {
        let tally = coordinator::released(answers);
        return finalize(world, c, tally);
    }
    if let Some(ahead) = attempt.ahead.as_mut() {
        for r in ahead.replies.iter_mut().filter(|r| r.is_none()) {
            *r = Some(NodeReply::Lost("timed out".into()));
        }
        return ahead_done(world, c);
    }
    match attempt.resolving.as_mut() {
        None => {
            for r in attempt.replies.iter_mut().filter(|r| r.is_none()) {
                *r = Some(NodeReply::Lost("timed out".into()));
            }
            proceed(world, c);
        }
        Some(_) if now > deadline => finalize(world, c, Tally::Unknown { node: 0 }),
        Some((_, waiting)) => {
            // Ask again, as `call_until` does until the deadline.
            let again: Vec<(NodeId, Request)> = std::mem::take(waiting).into_values().collect();
            let ids = send_requests(world, c, again.clone());
            let co = &mut world.coordinators[c];
            let resolving = co
                .attempt
                .as_mut()
                .expect("attempt")
                .resolving
                .as_mut()
                .expect("resolving");
            resolving.1 = ids.into_iter().zip(again).collect();
            arm_timeout(world, c, attempt_id);
        }
    }
}

fn proceed(world: &mut World, c: usize) {
    let co = &mut world.coordinators[c];
    let attempt = co.attempt.as_mut().expect("attempt");
    let replies = flatten(&attempt.replies);
    let tally = coordinator::tally(&attempt.nodes, &replies);
    if !matches!(tally, Tally::Unknown { .. }) {
        return settle(world, c, tally);
    }
    let op = co.op.as_ref().expect("an operation");
    let plan = coordinator::split(&op.tx);
    match coordinator::lost_vote_queries(&plan, attempt.tid, &replies, |_| true) {
        Err(tally) => finalize(world, c, tally),
        Ok(queries) => {
            let attempt_id = attempt.id;
            let waiting: BTreeMap<u64, (NodeId, Request)> =
                send_requests(world, c, queries.clone())
                    .into_iter()
                    .zip(queries)
                    .collect();
            world.coordinators[c]
                .attempt
                .as_mut()
                .expect("attempt")
                .resolving = Some((Vec::new(), waiting));
            arm_timeout(world, c, attempt_id);
        }
    }
}

/// A commit of a read-only minitransaction over several nodes first needs every participant
/// to confirm it still held its read locks (`coordinator::releases`, `coordinator::released`).
fn settle(world: &mut World, c: usize, tally: Tally) {
    let co = &world.coordinators[c];
    let (attempt, op) = (
        co.attempt.as_ref().expect("attempt"),
        co.op.as_ref().expect("an operation"),
    );
    let plan = coordinator::split(&op.tx);
    if tally != Tally::Commit || !plan.read_only() || plan.nodes().len() < 2 {
        return finalize(world, c, tally);
    }
    let (tid, attempt_id, n) = (attempt.tid, attempt.id, plan.nodes().len());
    let ids = send_requests(world, c, coordinator::releases(&plan, tid));
    let waiting = ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect();
    world.coordinators[c]
        .attempt
        .as_mut()
        .expect("attempt")
        .releasing = Some((vec![None; n], waiting));
    arm_timeout(world, c, attempt_id);
}

/// Sends `requests` from coordinator `c`, each under a fresh message id (returned in order).
fn send_requests(world: &mut World, c: usize, requests: Vec<(NodeId, Request)>) -> Vec<u64> {
    requests
        .into_iter()
        .map(|(node, req)| {
            let id = world.new_id();
            world.send(
                Endpoint::Coordinator(c),
                Endpoint::Node(node),
                Msg::Req { id, req },
            );
            id
        })
        .collect()
}

fn arm_timeout(world: &mut World, c: usize, attempt: u64) {
    world.at(
        REPLY_TIMEOUT_US,
        Event::CoordinatorTimeout {
            coordinator: c,
            attempt,
        },
    );
}

fn finalize(world: &mut World, c: usize, tally: Tally) {
    let co = &mut world.coordinators[c];
    let attempt = co.attempt.take().expect("attempt");
    let op = co.op.as_ref().expect("an operation");
    let audit_total = match (&tally, op.kind) {
        (Tally::Commit, OpKind::Audit) => {
            let out =
                coordinator::split(&op.tx).outcome(attempt.tid, &flatten(&attempt.replies), true);
            out.ok().and_then(Result::ok).map(|out| {
                out.reads
                    .iter()
                    .map(|r| u64::from_le_bytes(r[..8].try_into().expect("8 bytes")))
                    .sum::<u64>()
            })
        }
        _ => None,
    };
    let multi = attempt.nodes.len() > 1 || attempt.executed_ahead;
    let lsns = coordinator::commit_lsns(&flatten(&attempt.replies));
    let decide = |world: &mut World, commit: bool| {
        if multi {
            for &node in &attempt.nodes {
                let decision = Request::Decisions(vec![Decision {
                    tid: attempt.tid,
                    commit,
                    lsns: if commit { lsns.clone() } else { Vec::new() },
                }]);
                world.send_one_way(Endpoint::Coordinator(c), Endpoint::Node(node), decision);
            }
        }
    };
    let outcome = match tally {
        Tally::Commit => {
            if audit_total.is_none() {
                decide(world, true);
            }
            world.coordinators[c].audits.extend(audit_total);
            OpOutcome::Committed
        }
        Tally::AbortCompare => {
            decide(world, false);
            OpOutcome::AbortedCompare
        }
        Tally::Retry(_) => {
            decide(world, false);
            let op = world.coordinators[c].op.as_mut().expect("an operation");
            if world.now_us + op.backoff_us < op.deadline_us {
                let pause = op.backoff_us / 2 + world.rng.gen_range(0..=op.backoff_us / 2);
                let op = world.coordinators[c].op.as_mut().expect("an operation");
                op.backoff_us = (op.backoff_us * 2).min(100_000);
                world.coordinators[c].attempt = None;
                world.at(pause, Event::CoordinatorRetry { coordinator: c });
                return;
            }
            OpOutcome::Unknown
        }
        Tally::Rejected { node, message } => {
            decide(world, false);
            world.coordinators[c].errors.push(format!(
                "node {node} rejected a valid minitransaction: {message}"
            ));
            OpOutcome::Unknown
        }
        Tally::Unknown { .. } => OpOutcome::Unknown,
    };
    let co = &mut world.coordinators[c];
    let op = co.op.take().expect("an operation");
    co.outcomes.push((op.k, op.kind, outcome));
    start_next(world, c);
}

/// A stalled coordinator wakes up and sends the rest of phase 1.
pub(crate) fn resume(world: &mut World, c: usize, attempt_id: u64) {
    let Some(attempt) = world.coordinators[c].live_attempt(attempt_id) else {
        return;
    };
    let sends = std::mem::take(&mut attempt.stalled);
    for (node, msg) in sends {
        world.send(Endpoint::Coordinator(c), Endpoint::Node(node), msg);
    }
    arm_timeout(world, c, attempt_id);
}

pub(crate) fn retry(world: &mut World, c: usize) {
    let co = &world.coordinators[c];
    if co.crashed || co.op.is_none() || co.attempt.is_some() {
        return;
    }
    begin_attempt(world, c);
}
