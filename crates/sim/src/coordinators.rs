//! The minitransactions one simulated process of a layer above the core (the log's sequencer
//! and clients) has in flight, each driven by its own `Coordinator`, the code `Cluster` runs.
//! The bank's clients (`client`) drive theirs with their own faults in between.

use crate::msg::{Directory, Msg};
use crate::world::Ctx;
use rand::Rng;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_client::coordinator::{self, Actions, CallId, Coordinator, Next};
use tutti_client::{ClientOptions, ExecError, Minitx, NodeReply, Outcome};
use tutti_wire::{Request, Response, Tid};

/// How long a coordinator waits for replies before treating them as lost.
const REPLY_TIMEOUT_US: u64 = 30_000;
/// How long one minitransaction may take, retries included.
const DEADLINE_US: u64 = 2_000_000;

/// A minitransaction's number within its process.
pub(crate) type Handle = u64;

/// The coordinators' timers; the owning process hands them back to `on_timer`.
#[derive(Debug)]
pub(crate) enum CoordinatorTimer {
    Timer(Handle),
    Retry(Handle),
}

/// A finished minitransaction.
pub(crate) type Finished = (Handle, Result<Outcome, ExecError>);

pub(crate) struct Coordinators {
    dir: Rc<Directory>,
    coordinator_id: u64,
    seq: u64,
    epoch: u64,
    next: Handle,
    running: BTreeMap<Handle, Coordinator<'static>>,
    /// Message id of a request in flight → its minitransaction and call.
    calls: BTreeMap<u64, (Handle, CallId)>,
}

impl Coordinators {
    pub(crate) fn new(dir: Rc<Directory>, coordinator_id: u64) -> Coordinators {
        Coordinators {
            dir,
            coordinator_id,
            seq: 1,
            epoch: 1,
            next: 0,
            running: BTreeMap::new(),
            calls: BTreeMap::new(),
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

    /// Starts `tx`; its outcome comes back from `on_response` or `on_timer` (or here, for
    /// one refused before anything was sent).
    pub(crate) fn start(&mut self, ctx: &mut Ctx<'_>, tx: Minitx) -> (Handle, Option<Finished>) {
        let client = ClientOptions::default();
        let cfg = coordinator::Config {
            deadline_us: DEADLINE_US,
            reply_timeout_us: Some(REPLY_TIMEOUT_US),
            backoff_initial_us: client.backoff_initial.as_micros() as u64,
            backoff_max_us: client.backoff_max.as_micros() as u64,
            ahead: None,
        };
        let now = ctx.now_us();
        let mut co = Coordinator::new(Cow::Owned(tx), cfg, now, |_| true, ctx.rng().gen());
        let tid = self.next_tid();
        let acts = co.begin(now, tid);
        let handle = self.next;
        self.next += 1;
        self.running.insert(handle, co);
        let done = self.apply(ctx, handle, acts);
        (handle, done)
    }

    fn apply(&mut self, ctx: &mut Ctx<'_>, handle: Handle, acts: Actions) -> Option<Finished> {
        self.epoch = self.epoch.max(acts.epoch_seen);
        for (node, decision) in acts.decisions {
            let req = Request::Decisions(vec![decision]);
            crate::msg::send_one_way(ctx, self.dir.node(node), req);
        }
        for call in acts.calls {
            let id = ctx.new_id();
            self.calls.insert(id, (handle, call.id));
            let msg = Msg::Req {
                id,
                req: call.request,
            };
            ctx.send(self.dir.node(call.node), msg);
        }
        if let Some(at) = acts.timer_at_us {
            let delay = at.saturating_sub(ctx.now_us());
            ctx.set_timer(delay, CoordinatorTimer::Timer(handle));
        }
        match acts.next {
            Next::Wait => None,
            Next::Retry { at_us } => {
                let delay = at_us.saturating_sub(ctx.now_us());
                ctx.set_timer(delay, CoordinatorTimer::Retry(handle));
                None
            }
            Next::Done(result) => {
                self.running.remove(&handle);
                Some((handle, result))
            }
        }
    }

    /// A reply to one of the calls, and the minitransaction it finished if any; a reply to
    /// anything else comes back as `Err`.
    pub(crate) fn on_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        resp: Response,
    ) -> Result<Option<Finished>, Response> {
        let Some((handle, call)) = self.calls.remove(&id) else {
            return Err(resp);
        };
        let Some(co) = self.running.get_mut(&handle) else {
            return Ok(None);
        };
        let acts = co.on_reply(ctx.now_us(), call, NodeReply::from_response(resp));
        Ok(self.apply(ctx, handle, acts))
    }

    pub(crate) fn on_timer(
        &mut self,
        ctx: &mut Ctx<'_>,
        timer: CoordinatorTimer,
    ) -> Option<Finished> {
        let now = ctx.now_us();
        match timer {
            CoordinatorTimer::Timer(handle) => {
                let acts = self.running.get_mut(&handle)?.on_timer(now);
                self.apply(ctx, handle, acts)
            }
            CoordinatorTimer::Retry(handle) => {
                let tid = self.next_tid();
                let acts = self.running.get_mut(&handle)?.begin(now, tid);
                self.apply(ctx, handle, acts)
            }
        }
    }

    /// The process died: nothing it ran goes on, and its next tids are a new coordinator's.
    pub(crate) fn crash(&mut self, ctx: &mut Ctx<'_>) {
        self.running.clear();
        self.calls.clear();
        self.coordinator_id = ctx.rng().gen::<u64>() | 1 << 63;
        self.seq = 1;
    }
}
