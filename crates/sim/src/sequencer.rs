//! The simulated log sequencer: the real `LogService` (takeover, sequencer, reservations)
//! of one log, over the simulated network, with the manager and the memory nodes as they
//! are. It crashes like any faulty process and loses everything; a restart records its
//! address with the manager again and takes the log over on the first request. Several run
//! at once: each restart replaces whichever the manager named before, and the replaced one
//! serves on until it learns so, as a real one that was cut off would.

use crate::coordinators::{CoordinatorTimer, Coordinators, Finished, Handle};
use crate::msg::{self, Directory, ManagerRoute, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_client::Minitx;
use tutti_log::service::{Effect, FrameId, LogService};
use tutti_wire::{ErrorCode, Request, Response};

/// How long a manager request may go unanswered (a lost message) before it counts as failed.
const MANAGER_TIMEOUT_US: u64 = 50_000;

#[derive(Debug)]
enum SequencerTimer {
    /// Record the address again if the last `SetSequencer` went unanswered.
    Register,
    ManagerTimeout(u64),
}

/// What a minitransaction in flight is for.
enum Running {
    Step,
    Reserve { tx: Minitx, epoch: u64, to: u64 },
}

pub(crate) struct SimSequencer {
    /// The address it records with the manager.
    addr: String,
    log: String,
    lease: u64,
    manager: ManagerRoute,
    coordinators: Coordinators,
    service: LogService,
    registered: bool,
    register_id: u64,
    /// The last registration was answered `NotLeader` (the route moved already).
    redirected: bool,
    /// The manager request in flight (its message id).
    asking: Option<u64>,
    running: BTreeMap<Handle, Running>,
    frames: BTreeMap<FrameId, (Addr, u64)>,
}

impl SimSequencer {
    /// Sequencer number `i` (from 0) of `log`.
    pub(crate) fn new(i: u64, log: &str, lease: u64, dir: Rc<Directory>) -> SimSequencer {
        let addr = format!("sim-sequencer-{i}");
        SimSequencer {
            log: log.into(),
            lease,
            manager: ManagerRoute::new(&dir),
            coordinators: Coordinators::new(dir, (1 << 62) + (i << 48)),
            service: LogService::new(log.into(), addr.clone(), lease),
            addr,
            registered: false,
            register_id: 0,
            redirected: false,
            asking: None,
            running: BTreeMap::new(),
            frames: BTreeMap::new(),
        }
    }

    fn register(&mut self, ctx: &mut Ctx<'_>) {
        self.register_id = ctx.new_id();
        let req = Request::SetSequencer {
            addr: self.addr.clone(),
        };
        ctx.send(
            self.manager.addr(),
            Msg::Req {
                id: self.register_id,
                req,
            },
        );
        ctx.set_timer(MANAGER_TIMEOUT_US, SequencerTimer::Register);
    }

    fn carry_out(&mut self, ctx: &mut Ctx<'_>, effects: Vec<Effect>) {
        let mut effects = std::collections::VecDeque::from(effects);
        while let Some(effect) = effects.pop_front() {
            match effect {
                Effect::AskManager(req) => {
                    let id = ctx.new_id();
                    self.asking = Some(id);
                    ctx.send(self.manager.addr(), Msg::Req { id, req });
                    ctx.set_timer(MANAGER_TIMEOUT_US, SequencerTimer::ManagerTimeout(id));
                }
                Effect::Run(tx) => self.start(ctx, tx, Running::Step, &mut effects),
                Effect::Reserve { tx, epoch, to } => {
                    let running = Running::Reserve {
                        tx: tx.clone(),
                        epoch,
                        to,
                    };
                    self.start(ctx, tx, running, &mut effects);
                }
                Effect::Answer(frame, answers) => {
                    if let Some((to, id)) = self.frames.remove(&frame) {
                        ctx.send(
                            to,
                            Msg::Resp {
                                id,
                                resp: Response::Sequenced(answers),
                            },
                        );
                    }
                }
                Effect::Refuse(frame, code, message) => {
                    if let Some((to, id)) = self.frames.remove(&frame) {
                        let resp = Response::Error { code, message };
                        ctx.send(to, Msg::Resp { id, resp });
                    }
                }
            }
        }
    }

    fn start(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: Minitx,
        running: Running,
        effects: &mut std::collections::VecDeque<Effect>,
    ) {
        let (handle, done) = self.coordinators.start(ctx, tx);
        self.running.insert(handle, running);
        if let Some(done) = done {
            effects.extend(self.finished(ctx, done));
        }
    }

    /// A minitransaction finished: a takeover step goes back to the service; a reservation
    /// without an outcome runs again.
    fn finished(&mut self, ctx: &mut Ctx<'_>, (handle, result): Finished) -> Vec<Effect> {
        match self.running.remove(&handle) {
            Some(Running::Step) => self.service.on_outcome(result.map_err(|e| e.to_string())),
            Some(Running::Reserve { tx, epoch, to }) => match result {
                Ok(outcome) => self.service.on_reserved(epoch, to, &outcome),
                Err(_) => {
                    let mut effects = std::collections::VecDeque::new();
                    self.start(
                        ctx,
                        tx.clone(),
                        Running::Reserve { tx, epoch, to },
                        &mut effects,
                    );
                    effects.into()
                }
            },
            None => vec![],
        }
    }
}

impl Process for SimSequencer {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        match msg::open(msg) {
            Msg::Req {
                id,
                req:
                    Request::Sequence {
                        log,
                        min_epoch,
                        asks,
                    },
            } => {
                if !self.registered || log != self.log {
                    let resp = Response::Error {
                        code: ErrorCode::NotReady,
                        message: "not serving this log yet".into(),
                    };
                    ctx.send(from, Msg::Resp { id, resp });
                    return;
                }
                let (frame, effects) = self.service.on_frame(min_epoch, asks);
                self.frames.insert(frame, (from, id));
                self.carry_out(ctx, effects);
            }
            Msg::Req { .. } => {}
            Msg::Resp { id, resp } => {
                if id == self.register_id {
                    self.redirected = self.manager.not_leader(&resp);
                    self.registered = matches!(resp, Response::Sequencer(_));
                    return;
                }
                if self.asking == Some(id) {
                    self.asking = None;
                    let reply = match resp {
                        _ if self.manager.not_leader(&resp) => {
                            Err((ErrorCode::NotReady, "not the leading manager".into()))
                        }
                        Response::Error { code, message } => Err((code, message)),
                        other => Ok(other),
                    };
                    let effects = self.service.on_manager(reply);
                    return self.carry_out(ctx, effects);
                }
                if let Ok(Some(done)) = self.coordinators.on_response(ctx, id, resp) {
                    let effects = self.finished(ctx, done);
                    self.carry_out(ctx, effects);
                }
            }
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        let timer = match timer.downcast::<CoordinatorTimer>() {
            Ok(t) => {
                if let Some(done) = self.coordinators.on_timer(ctx, *t) {
                    let effects = self.finished(ctx, done);
                    self.carry_out(ctx, effects);
                }
                return;
            }
            Err(other) => other,
        };
        match *timer
            .downcast::<SequencerTimer>()
            .expect("a sequencer timer")
        {
            SequencerTimer::Register => {
                if !self.registered {
                    if !std::mem::take(&mut self.redirected) {
                        self.manager.silent();
                    }
                    self.register(ctx);
                }
            }
            SequencerTimer::ManagerTimeout(id) => {
                if self.asking == Some(id) {
                    self.asking = None;
                    self.manager.silent();
                    let lost = Err((ErrorCode::NotReady, "the manager did not answer".into()));
                    let effects = self.service.on_manager(lost);
                    self.carry_out(ctx, effects);
                }
            }
        }
    }

    fn on_crash(&mut self, ctx: &mut Ctx<'_>, _power_loss: bool) {
        self.coordinators.crash(ctx);
        self.service = LogService::new(self.log.clone(), self.addr.clone(), self.lease);
        self.registered = false;
        self.asking = None;
        self.running.clear();
        self.frames.clear();
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        self.register(ctx);
    }

    fn settled(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("{} at epoch {:?}", self.addr, self.service.epoch())
    }
}
