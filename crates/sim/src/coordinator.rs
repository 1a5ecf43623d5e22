//! Simulated coordinators running the bank workload: each operation is driven by the
//! client's own `Coordinator` (the code `Cluster` runs), here over the simulated network.
//! Faults are the driver's: a coordinator stalls (its process pauses) after its first
//! EXEC&PREPARE, or dies between the phases. Each transfer also writes a one-byte receipt
//! on every node it touches, so the checker can see exactly which transfers were applied.

use crate::{Endpoint, Event, Msg, SimConfig, World};
use rand::Rng;
use std::borrow::Cow;
use std::collections::BTreeMap;
use tutti_client::coordinator::{self, Actions, CallId, Coordinator, ExecuteAhead, Next};
use tutti_client::{ClientOptions, ExecError, Minitx, NodeReply, Outcome};
use tutti_wire::{CmpOp, NodeId, Request, Tid};

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
    /// Names this operation in timer events, so that a later one ignores them.
    id: u64,
    k: usize,
    kind: OpKind,
    co: Coordinator<'static>,
    /// Message id of each request in flight → the coordinator's call.
    calls: BTreeMap<u64, CallId>,
}

pub(crate) struct SimCoordinator {
    coordinator_id: u64,
    seq: u64,
    epoch: u64,
    next_k: usize,
    ops_total: usize,
    op: Option<Op>,
    crashed: bool,
    /// A stalled coordinator handles nothing before this time.
    paused_until_us: u64,
    /// Requests a stalled coordinator sends when it resumes.
    held: Vec<(NodeId, Msg)>,
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
            crashed: false,
            paused_until_us: 0,
            held: Vec::new(),
            outcomes: Vec::new(),
            audits: Vec::new(),
            errors: Vec::new(),
        }
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

    fn next_tid(&mut self) -> Tid {
        self.seq += 1;
        Tid {
            epoch: self.epoch,
            coordinator: self.coordinator_id,
            seq: self.seq - 1,
        }
    }

    /// The current operation's coordinator, if `op` is still current and the process alive.
    fn live(&mut self, op: u64) -> Option<&mut Coordinator<'static>> {
        match &mut self.op {
            Some(o) if o.id == op && !self.crashed => Some(&mut o.co),
            _ => None,
        }
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
    let ahead = world
        .rng
        .gen_bool(world.cfg.execute_ahead_probability)
        .then(|| match world.rng.gen_bool(0.5) {
            true => ExecuteAhead::PerItem,
            false => ExecuteAhead::PerNode,
        });
    // The backoff of the client's defaults; a shorter deadline keeps runs short.
    let client = ClientOptions::default();
    let cfg = coordinator::Config {
        deadline_us: OP_DEADLINE_US,
        reply_timeout_us: Some(REPLY_TIMEOUT_US),
        backoff_initial_us: client.backoff_initial.as_micros() as u64,
        backoff_max_us: client.backoff_max.as_micros() as u64,
        ahead,
    };
    let jitter_seed = world.rng.gen();
    let mut co = Coordinator::new(Cow::Owned(tx), cfg, world.now_us, |_| true, jitter_seed);
    let id = world.new_id();
    let sc = &mut world.coordinators[c];
    sc.next_k += 1;
    let acts = co.begin(world.now_us, sc.next_tid());
    sc.op = Some(Op {
        id,
        k,
        kind,
        co,
        calls: BTreeMap::new(),
    });
    apply(world, c, acts);
}

/// Carries out a coordinator's actions over the simulated network, injecting the
/// coordinator's own faults after a multi-node phase 1 goes out.
fn apply(world: &mut World, c: usize, acts: Actions) {
    let from = Endpoint::Coordinator(c);
    let sc = &mut world.coordinators[c];
    sc.epoch = sc.epoch.max(acts.epoch_seen);
    let op = sc.op.as_ref().expect("an operation").id;
    for (node, decision) in acts.decisions {
        let decisions = Request::Decisions(vec![decision]);
        world.send_one_way(from, Endpoint::Node(node), decisions);
    }
    let phase_one = acts.calls.len() > 1
        && (acts.calls.iter()).all(|call| matches!(call.request, Request::ExecPrepare(_)));
    let mut sends = Vec::with_capacity(acts.calls.len());
    for call in acts.calls {
        let id = world.new_id();
        let sc = &mut world.coordinators[c];
        sc.op
            .as_mut()
            .expect("an operation")
            .calls
            .insert(id, call.id);
        let msg = Msg::Req {
            id,
            req: call.request,
        };
        sends.push((call.node, msg));
    }
    if phase_one && world.faults_on() && world.rng.gen_bool(world.cfg.slow_coordinator_probability)
    {
        // Stalls after its first EXEC&PREPARE for longer than the uncertain timeout, so
        // recovery runs concurrently with it (Sinfonia Fig. 9).
        let stall = world.rng.gen_range(120_000..400_000);
        let sc = &mut world.coordinators[c];
        sc.held = sends.split_off(1);
        sc.paused_until_us = world.now_us + stall;
        world.at(stall, Event::CoordinatorResume { coordinator: c });
    }
    for (node, msg) in sends {
        world.send(from, Endpoint::Node(node), msg);
    }
    if let Some(at) = acts.timer_at_us {
        let event = Event::CoordinatorTimer { coordinator: c, op };
        world.at(at.saturating_sub(world.now_us), event);
    }
    match acts.next {
        Next::Wait => {}
        Next::Retry { at_us } => {
            let event = Event::CoordinatorRetry { coordinator: c, op };
            world.at(at_us.saturating_sub(world.now_us), event);
        }
        Next::Done(result) => return finish(world, c, result),
    }
    if phase_one && world.faults_on() && world.rng.gen_bool(world.cfg.coordinator_crash_probability)
    {
        crash(world, c);
    }
}

/// Dies between the phases: its votes stay uncertain until the manager recovers them.
fn crash(world: &mut World, c: usize) {
    let sc = &mut world.coordinators[c];
    sc.crashed = true;
    sc.held.clear();
    sc.paused_until_us = 0;
    let op = sc.op.take().expect("an operation");
    sc.outcomes.push((op.k, op.kind, OpOutcome::Unknown));
    world.coordinator_crashes += 1;
    let down = world.rng.gen_range(1_000..50_000);
    world.at(down, Event::CoordinatorRestart { coordinator: c });
}

fn finish(world: &mut World, c: usize, result: Result<Outcome, ExecError>) {
    let sc = &mut world.coordinators[c];
    let op = sc.op.take().expect("an operation");
    let outcome = match result {
        Ok(Outcome {
            committed: true,
            reads,
            ..
        }) => {
            if let OpKind::Audit = op.kind {
                let total = reads
                    .iter()
                    .map(|r| u64::from_le_bytes(r[..8].try_into().expect("8 bytes")));
                sc.audits.push(total.sum());
            }
            OpOutcome::Committed
        }
        Ok(_) => OpOutcome::AbortedCompare,
        Err(ExecError::Rejected { node, message }) => {
            let error = format!("node {node} rejected a valid minitransaction: {message}");
            sc.errors.push(error);
            OpOutcome::Unknown
        }
        Err(_) => OpOutcome::Unknown,
    };
    sc.outcomes.push((op.k, op.kind, outcome));
    start_next(world, c);
}

/// A stalled coordinator handles no event before it resumes: `false` when this one was
/// put off until then.
fn awake(world: &mut World, c: usize, event: impl FnOnce() -> Event) -> bool {
    let until = world.coordinators[c].paused_until_us;
    if world.now_us >= until {
        return true;
    }
    world.at(until - world.now_us, event());
    false
}

pub(crate) fn restart(world: &mut World, c: usize) {
    let fresh = world.rng.gen::<u64>() | 1 << 63;
    let sc = &mut world.coordinators[c];
    sc.crashed = false;
    sc.coordinator_id = fresh;
    sc.seq = 1;
    start_next(world, c);
}

pub(crate) fn deliver(world: &mut World, c: usize, from: Endpoint, msg: Msg) {
    let Msg::Resp { id, resp } = msg else { return };
    if world.coordinators[c].crashed {
        return;
    }
    if !awake(world, c, || Event::Deliver {
        from,
        to: Endpoint::Coordinator(c),
        msg: Msg::Resp {
            id,
            resp: resp.clone(),
        },
    }) {
        return;
    }
    let now = world.now_us;
    let Some(op) = world.coordinators[c].op.as_mut() else {
        return;
    };
    let Some(call) = op.calls.remove(&id) else {
        return;
    };
    let acts = op.co.on_reply(now, call, NodeReply::from_response(resp));
    apply(world, c, acts);
}

pub(crate) fn timer(world: &mut World, c: usize, op: u64) {
    if !awake(world, c, || Event::CoordinatorTimer { coordinator: c, op }) {
        return;
    }
    let now = world.now_us;
    if let Some(co) = world.coordinators[c].live(op) {
        let acts = co.on_timer(now);
        apply(world, c, acts);
    }
}

pub(crate) fn retry(world: &mut World, c: usize, op: u64) {
    if !awake(world, c, || Event::CoordinatorRetry { coordinator: c, op }) {
        return;
    }
    let now = world.now_us;
    let sc = &mut world.coordinators[c];
    if sc.live(op).is_none() {
        return;
    }
    let tid = sc.next_tid();
    let acts = sc.live(op).expect("live").begin(now, tid);
    apply(world, c, acts);
}

/// A stalled coordinator wakes up and sends the rest of phase 1.
pub(crate) fn resume(world: &mut World, c: usize) {
    let sc = &mut world.coordinators[c];
    if sc.crashed {
        return;
    }
    sc.paused_until_us = 0;
    for (node, msg) in std::mem::take(&mut sc.held) {
        world.send(Endpoint::Coordinator(c), Endpoint::Node(node), msg);
    }
}
