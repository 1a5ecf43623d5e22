//! A simulated client running a workload: each minitransaction is driven by the client's
//! own `Coordinator` (the code `Cluster` runs), here over the simulated network. Faults are
//! the client process's own: it stalls (pauses) after its first EXEC&PREPARE, or dies
//! between the phases.

use crate::msg::{self, Directory, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_client::coordinator::{self, Actions, CallId, Coordinator, ExecuteAhead, Next};
use tutti_client::{ClientOptions, ExecError, Minitx, NodeReply, Outcome};
use tutti_wire::{NodeId, Request, Tid};
use tutti_workload::Workload;

/// How long a coordinator waits for replies before treating them as lost.
const REPLY_TIMEOUT_US: u64 = 30_000;
/// How long one minitransaction may take, retries included (the client's deadline).
const DEADLINE_US: u64 = 5_000_000;

/// What a simulated client does, and the faults it injects into itself.
#[derive(Clone, Debug)]
pub(crate) struct ClientConfig {
    pub(crate) ops: usize,
    /// Probability that it dies between the phases of a multi-node minitransaction.
    pub(crate) crash_probability: f64,
    /// Probability that it stalls after its first EXEC&PREPARE for longer than the
    /// uncertain timeout, so recovery runs concurrently with it (Sinfonia Fig. 9).
    pub(crate) stall_probability: f64,
    /// Probability that an attempt first executes its items with `ExecuteAhead` (Sinfonia
    /// Fig. 17 Systems A and B) and only then runs the commit protocol.
    pub(crate) execute_ahead_probability: f64,
}

#[derive(Debug)]
enum ClientTimer {
    /// The coordinator's timer, for operation `op`.
    Coordinator(u64),
    /// The coordinator's next attempt, for operation `op`.
    Retry(u64),
    /// A stall is over: send the rest of phase 1.
    Resume,
}

struct Op<O> {
    /// Names this operation in timer events, so that a later one ignores them.
    id: u64,
    op: O,
    co: Coordinator<'static>,
    /// Message id of each request in flight → the coordinator's call.
    calls: BTreeMap<u64, CallId>,
    /// The tid of the current attempt and a node it went to (for an unknown outcome).
    attempt: Option<(Tid, NodeId)>,
}

pub(crate) struct SimClient<W: Workload> {
    client: u64,
    cfg: ClientConfig,
    workload: Rc<RefCell<W>>,
    dir: Rc<Directory>,
    coordinator_id: u64,
    seq: u64,
    epoch: u64,
    started_ops: usize,
    /// Started once: a restart is after a crash.
    started: bool,
    op: Option<Op<W::Op>>,
    /// Requests a stalled client sends when it resumes.
    held: Vec<(Addr, Msg)>,
}

impl<W: Workload + 'static> SimClient<W> {
    pub(crate) fn new(
        client: u64,
        cfg: ClientConfig,
        workload: Rc<RefCell<W>>,
        dir: Rc<Directory>,
    ) -> SimClient<W> {
        SimClient {
            client,
            cfg,
            workload,
            dir,
            coordinator_id: client + 1,
            seq: 1,
            epoch: 1,
            started_ops: 0,
            started: false,
            op: None,
            held: Vec::new(),
        }
    }

    fn next_tid(&mut self) -> Tid {
        self.seq += 1;
        Tid {
            epoch: self.epoch,
            coordinator: self.coordinator_id,
            seq: self.seq - 1,
        }
    }

    fn start_next(&mut self, ctx: &mut Ctx<'_>) {
        if self.started_ops == self.cfg.ops {
            return;
        }
        self.started_ops += 1;
        let (op, tx) = self.workload.borrow_mut().next(self.client, ctx.rng());
        self.run(ctx, op, tx);
    }

    /// Runs one minitransaction of `op` with a new coordinator.
    fn run(&mut self, ctx: &mut Ctx<'_>, op: W::Op, tx: Minitx) {
        let ahead = (ctx.rng())
            .gen_bool(self.cfg.execute_ahead_probability)
            .then(|| match ctx.rng().gen_bool(0.5) {
                true => ExecuteAhead::PerItem,
                false => ExecuteAhead::PerNode,
            });
        // The backoff of the client's defaults; a shorter deadline keeps runs short.
        let client = ClientOptions::default();
        let cfg = coordinator::Config {
            deadline_us: DEADLINE_US,
            reply_timeout_us: Some(REPLY_TIMEOUT_US),
            backoff_initial_us: client.backoff_initial.as_micros() as u64,
            backoff_max_us: client.backoff_max.as_micros() as u64,
            ahead,
        };
        let jitter_seed = ctx.rng().gen();
        let now = ctx.now_us();
        let mut co = Coordinator::new(Cow::Owned(tx), cfg, now, |_| true, jitter_seed);
        let tid = self.next_tid();
        let acts = co.begin(now, tid);
        self.op = Some(Op {
            id: ctx.new_id(),
            op,
            co,
            calls: BTreeMap::new(),
            attempt: None,
        });
        self.apply(ctx, tid, acts);
    }

    /// Carries out a coordinator's actions over the simulated network, injecting the
    /// client's own faults after a multi-node phase 1 goes out.
    fn apply(&mut self, ctx: &mut Ctx<'_>, tid: Tid, acts: Actions) {
        self.epoch = self.epoch.max(acts.epoch_seen);
        for (node, decision) in acts.decisions {
            let decisions = Request::Decisions(vec![decision]);
            msg::send_one_way(ctx, self.dir.node(node), decisions);
        }
        let phase_one = acts.calls.len() > 1
            && (acts.calls.iter()).all(|call| matches!(call.request, Request::ExecPrepare(_)));
        let op = self.op.as_mut().expect("an operation");
        if let Some(call) = acts.calls.first() {
            op.attempt = Some((tid, call.node));
        }
        let mut sends = Vec::with_capacity(acts.calls.len());
        for call in acts.calls {
            let id = ctx.new_id();
            op.calls.insert(id, call.id);
            let msg = Msg::Req {
                id,
                req: call.request,
            };
            sends.push((self.dir.node(call.node), msg));
        }
        let op_id = op.id;
        if phase_one && ctx.faults_on() && ctx.rng().gen_bool(self.cfg.stall_probability) {
            let stall = ctx.rng().gen_range(120_000..400_000);
            self.held = sends.split_off(1);
            ctx.pause_me(stall);
            ctx.set_timer(stall, ClientTimer::Resume);
        }
        for (to, msg) in sends {
            ctx.send(to, msg);
        }
        if let Some(at) = acts.timer_at_us {
            ctx.set_timer(
                at.saturating_sub(ctx.now_us()),
                ClientTimer::Coordinator(op_id),
            );
        }
        match acts.next {
            Next::Wait => {}
            Next::Retry { at_us } => {
                ctx.set_timer(
                    at_us.saturating_sub(ctx.now_us()),
                    ClientTimer::Retry(op_id),
                );
            }
            Next::Done(result) => return self.finish(ctx, result),
        }
        if phase_one && ctx.faults_on() && ctx.rng().gen_bool(self.cfg.crash_probability) {
            ctx.count("coordinator_crashes", 1);
            let down = ctx.rng().gen_range(1_000..50_000);
            ctx.crash_me(down);
        }
    }

    /// Hands the outcome to the workload, which may continue the operation.
    fn finish(&mut self, ctx: &mut Ctx<'_>, result: Result<Outcome, ExecError>) {
        let mut op = self.op.take().expect("an operation");
        let next = (self.workload.borrow_mut()).record(
            self.client,
            &mut op.op,
            result.as_ref(),
            ctx.rng(),
        );
        match next {
            Some(tx) => self.run(ctx, op.op, tx),
            None => self.start_next(ctx),
        }
    }

    /// The current operation's coordinator, if `op` is still current.
    fn live(&mut self, op: u64) -> Option<&mut Coordinator<'static>> {
        match &mut self.op {
            Some(o) if o.id == op => Some(&mut o.co),
            _ => None,
        }
    }
}

impl<W: Workload + 'static> Process for SimClient<W> {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, _from: Addr, msg: Box<dyn Message>) {
        let Msg::Resp { id, resp } = msg::open(msg) else {
            return;
        };
        let Some(op) = self.op.as_mut() else {
            return;
        };
        let Some(call) = op.calls.remove(&id) else {
            return;
        };
        let acts = op
            .co
            .on_reply(ctx.now_us(), call, NodeReply::from_response(resp));
        let tid = op.attempt.expect("an attempt sent calls").0;
        self.apply(ctx, tid, acts);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        let now = ctx.now_us();
        match *timer.downcast::<ClientTimer>().expect("a client timer") {
            ClientTimer::Coordinator(op) => {
                if let Some(co) = self.live(op) {
                    let acts = co.on_timer(now);
                    let tid = self.op.as_ref().and_then(|o| o.attempt).expect("sent").0;
                    self.apply(ctx, tid, acts);
                }
            }
            ClientTimer::Retry(op) => {
                if self.live(op).is_some() {
                    let tid = self.next_tid();
                    let acts = self.live(op).expect("live").begin(now, tid);
                    self.apply(ctx, tid, acts);
                }
            }
            ClientTimer::Resume => {
                for (to, msg) in std::mem::take(&mut self.held) {
                    ctx.send(to, msg);
                }
            }
        }
    }

    /// Dies: its votes stay uncertain until the manager recovers them, and its operation's
    /// outcome is unknown.
    fn on_crash(&mut self, ctx: &mut Ctx<'_>, _power_loss: bool) {
        self.held.clear();
        if let Some(mut op) = self.op.take() {
            let (tid, node) = op.attempt.expect("crashed after sending");
            let why = "the client crashed".into();
            let unknown = ExecError::OutcomeUnknown { tid, node, why };
            let next = (self.workload.borrow_mut()).record(
                self.client,
                &mut op.op,
                Err(&unknown),
                ctx.rng(),
            );
            assert!(next.is_none(), "an operation ends at an unknown outcome");
        }
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        if self.started {
            // A new process: a fresh coordinator id, so its tids are new.
            self.coordinator_id = ctx.rng().gen::<u64>() | 1 << 63;
            self.seq = 1;
        }
        self.started = true;
        self.start_next(ctx);
    }

    fn settled(&self) -> bool {
        self.started_ops == self.cfg.ops && self.op.is_none()
    }

    fn describe(&self) -> String {
        format!(
            "client {}: {} of {} operations started, one running: {}",
            self.client,
            self.started_ops,
            self.cfg.ops,
            self.op.is_some()
        )
    }
}
